package dberr

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docs/errors.md's table of constraints and client texts is the table
// here: a reader who looks up a rejection finds the text a client gets.
// Mutations killed: a constraint added to clientTexts without a row in
// the doc (events_created_at_floor once had none); a text reworded in one
// place only.
func TestErrorsDocListsEveryClientText(t *testing.T) {
	raw, err := os.ReadFile("../../docs/errors.md")
	require.NoError(t, err)
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| (.+) \\|$")
	documented := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(raw), -1) {
		documented[m[1]] = strings.ReplaceAll(m[2], "`", "")
	}
	require.Contains(t, documented, "channels_pkey", "the doc's constraint table is still found")
	require.Equal(t, clientTexts, documented)
}
