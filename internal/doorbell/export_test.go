package doorbell

import (
	"context"

	"github.com/google/uuid"
)

// MemberNames is members: the display names of the channel's members
// whose profiles the verifier signature-checked and handed to the mention
// rules for template.
func (v *Verifier) MemberNames(ctx context.Context, channel uuid.UUID, template string) ([]string, error) {
	members, d := v.members(ctx, channel, template)
	if d != nil {
		return nil, d
	}
	names := make([]string, len(members))
	for i, m := range members {
		names[i] = m.DisplayName
	}
	return names, nil
}
