package nostr

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Filter is a NIP-01 subscription filter (with the NIP-50 search field).
// A nil slice means the condition was absent; a non-nil empty slice was
// given as [] and matches nothing.
type Filter struct {
	IDs     []string
	Authors []string
	Kinds   []int
	Tags    map[string][]string // "#e" is stored under "e"
	Since   *int64
	Until   *int64
	Limit   *int // nil = not given
	Search  string
	// AgentOwner ("agent_owner", 64-char lowercase hex; "" = absent, as is
	// JSON null) keeps only events whose author's recorded agent owner in
	// the community is this pubkey. The owner is a database relationship,
	// so only stored-event reads can apply it (see Matches).
	AgentOwner string

	// tagSets holds each tag list longer than tagSetMin as a set, once
	// IndexTags has built it; Matches then looks an event's tags up in it
	// instead of scanning the list for each of them.
	tagSets map[string]map[string]struct{}
}

// tagSetMin is the longest tag list Matches scans; longer ones are worth a
// set. A scan costs tags x values: a live subscription holding 1,999 values
// of one tag, against an event carrying 2,000 tags of that name, took
// 20 ms a match (far longer with long values sharing a prefix), on the
// publisher's fan-out and on every relay's one Redis receiver.
const tagSetMin = 16

// IndexTags builds the sets Matches uses for long tag lists. Call it once,
// before the filter is matched concurrently (the fan-out hub does, on
// Subscribe); the filter's lists must not change afterwards.
func (f *Filter) IndexTags() {
	for name, vals := range f.Tags {
		if len(vals) <= tagSetMin {
			continue
		}
		set := make(map[string]struct{}, len(vals))
		for _, v := range vals {
			set[v] = struct{}{}
		}
		if f.tagSets == nil {
			f.tagSets = map[string]map[string]struct{}{}
		}
		f.tagSets[name] = set
	}
}

// Filters is the filter list of a REQ or COUNT; an event matches if any filter does.
type Filters []Filter

// Matches reports whether e satisfies every condition of f. Limit and Search
// are ignored: they only make sense for stored-event queries. A filter with
// AgentOwner never matches: the event alone cannot say who owns its author,
// and matching without that condition would deliver other owners' events.
func (f *Filter) Matches(e *Event) bool {
	if f.AgentOwner != "" {
		return false
	}
	// Cheapest and most selective checks first.
	if f.Kinds != nil && !slices.Contains(f.Kinds, e.Kind) {
		return false
	}
	if f.Since != nil && e.CreatedAt < *f.Since {
		return false
	}
	if f.Until != nil && e.CreatedAt > *f.Until {
		return false
	}
	if f.Authors != nil && !containsHex(f.Authors, e.PubKey) {
		return false
	}
	if f.IDs != nil && !containsHex(f.IDs, e.ID) {
		return false
	}
	for name, vals := range f.Tags {
		if set, ok := f.tagSets[name]; ok {
			if !e.Tags.hasAnyIn(name, set) {
				return false
			}
		} else if !e.Tags.hasAny(name, vals) {
			return false
		}
	}
	return true
}

// containsHex is slices.Contains specialised for lists of random-looking
// strings (ids, pubkeys) that are often long: comparing the first byte
// inline rejects almost every candidate without a call to memequal.
func containsHex(list []string, s string) bool {
	if s == "" {
		return slices.Contains(list, s)
	}
	c := s[0]
	for _, v := range list {
		if len(v) == len(s) && v[0] == c && v == s {
			return true
		}
	}
	return false
}

// Matches reports whether any filter matches e.
func (fs Filters) Matches(e *Event) bool {
	for i := range fs {
		if fs[i].Matches(e) {
			return true
		}
	}
	return false
}

// AppendJSON appends f as a compact JSON object. Tag filters are written in
// sorted order so the output is deterministic.
func (f *Filter) AppendJSON(dst []byte) []byte {
	dst = append(dst, '{')
	first := true
	field := func(name string) {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, name...)
	}
	strs := func(vals []string) {
		dst = append(dst, '[')
		for i, v := range vals {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendQuoted(dst, v)
		}
		dst = append(dst, ']')
	}
	if f.IDs != nil {
		field(`"ids":`)
		strs(f.IDs)
	}
	if f.Authors != nil {
		field(`"authors":`)
		strs(f.Authors)
	}
	if f.Kinds != nil {
		field(`"kinds":[`)
		for i, k := range f.Kinds {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(k), 10)
		}
		dst = append(dst, ']')
	}
	if len(f.Tags) > 0 {
		names := make([]string, 0, len(f.Tags))
		for name := range f.Tags {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			field("")
			dst = appendQuoted(dst, "#"+name)
			dst = append(dst, ':')
			vals := f.Tags[name]
			if vals == nil {
				vals = []string{}
			}
			strs(vals)
		}
	}
	if f.Since != nil {
		field(`"since":`)
		dst = strconv.AppendInt(dst, *f.Since, 10)
	}
	if f.Until != nil {
		field(`"until":`)
		dst = strconv.AppendInt(dst, *f.Until, 10)
	}
	if f.Limit != nil {
		field(`"limit":`)
		dst = strconv.AppendInt(dst, int64(*f.Limit), 10)
	}
	if f.Search != "" {
		field(`"search":`)
		dst = appendQuoted(dst, f.Search)
	}
	if f.AgentOwner != "" {
		field(`"agent_owner":`)
		dst = appendQuoted(dst, f.AgentOwner)
	}
	return append(dst, '}')
}

// MarshalJSON encodes f as a compact JSON object.
func (f *Filter) MarshalJSON() ([]byte, error) {
	return f.AppendJSON(nil), nil
}

// UnmarshalJSON decodes one filter with the same strict rules as
// ParseClientMessage, without limits.
func (f *Filter) UnmarshalJSON(b []byte) error {
	d := getDecoder(b)
	defer putDecoder(d)
	var nf Filter
	if err := d.filter(&nf, &Limits{}); err != nil {
		return err
	}
	if err := d.end(); err != nil {
		return err
	}
	*f = nf
	return nil
}

var (
	errFilterObject = errors.New("filter must be a JSON object")
	errIDs          = errors.New("ids must be 64-char lowercase hex")
	errAuthors      = errors.New("authors must be 64-char lowercase hex")
	errKinds        = errors.New("kinds must be integers between 0 and 65535")
	errSince        = errors.New("since must be a non-negative integer")
	errUntil        = errors.New("until must be a non-negative integer")
	errLimit        = errors.New("limit must be a non-negative integer")
	errSearch       = errors.New("search must be a string")
	errSearchNUL    = errors.New("search must not contain NUL characters")
)

// FilterFieldError is a filter refused because of one field's value, with
// the position of the filter in its list so a client can find it.
type FilterFieldError struct {
	Filter int // index in the REQ/COUNT or HTTP filter list; -1 for a lone filter
	Field  string
	Reason string
}

func (e *FilterFieldError) Error() string {
	if e.Filter < 0 {
		return e.Field + " " + e.Reason
	}
	return fmt.Sprintf("filter %d: %s %s", e.Filter, e.Field, e.Reason)
}

// atFilter records which filter of a list err belongs to, when it names a field.
func atFilter(err error, index int) error {
	var fe *FilterFieldError
	if errors.As(err, &fe) {
		fe.Filter = index
	}
	return err
}

const agentOwnerReason = "must be a 64-char lowercase hex pubkey (or null for no owner constraint)"

const (
	filterIDs = 1 << iota
	filterAuthors
	filterKinds
	filterSince
	filterUntil
	filterLimit
	filterSearch
	filterAgentOwner
)

// filter decodes one filter object into f. Unlike events, the first error
// ends the parse: nothing later in the filter would improve the reply.
func (d *decoder) filter(f *Filter, lim *Limits) error {
	if !d.consume('{') {
		return d.wrongType(errFilterObject)
	}
	if d.consume('}') {
		return nil
	}
	var seen, nvals int
	// count enforces MaxFilterValues as values are read, so a huge filter is
	// rejected before it is fully decoded.
	count := func() error {
		nvals++
		if lim.MaxFilterValues > 0 && nvals > lim.MaxFilterValues {
			return fmt.Errorf("too many values in filter (max %d)", lim.MaxFilterValues)
		}
		return nil
	}
	for {
		k, err := d.key()
		if err != nil {
			return err
		}
		bit := 0
		switch string(k) {
		case "ids":
			bit = filterIDs
		case "authors":
			bit = filterAuthors
		case "kinds":
			bit = filterKinds
		case "since":
			bit = filterSince
		case "until":
			bit = filterUntil
		case "limit":
			bit = filterLimit
		case "search":
			bit = filterSearch
		case "agent_owner":
			bit = filterAgentOwner
		default:
			if len(k) == 0 || k[0] != '#' {
				return fmt.Errorf("unknown filter field %q", truncate(k, 32))
			}
			if len(k) != 2 || !isASCIILetter(k[1]) {
				return fmt.Errorf("tag filter %q must be # followed by one ASCII letter", truncate(k, 32))
			}
		}
		if bit != 0 {
			if seen&bit != 0 {
				return fmt.Errorf("duplicate filter field %q", k)
			}
			seen |= bit
		}
		switch bit {
		case filterIDs:
			f.IDs, err = d.hexList(errIDs, count)
		case filterAuthors:
			f.Authors, err = d.hexList(errAuthors, count)
		case filterKinds:
			f.Kinds, err = d.kinds(count)
		case filterSince:
			f.Since, err = d.timestamp(errSince)
		case filterUntil:
			f.Until, err = d.timestamp(errUntil)
		case filterLimit:
			var v int64
			var ok bool
			v, ok, err = d.intValue(int64(^uint(0) >> 1)) // max int
			if err == nil && !ok {
				err = errLimit
			}
			n := int(v)
			f.Limit = &n
		case filterSearch:
			if d.peek() != '"' {
				return d.wrongType(errSearch)
			}
			f.Search, err = d.string()
			switch {
			case err != nil:
			case lim.MaxSearchBytes > 0 && len(f.Search) > lim.MaxSearchBytes:
				// Each word is a node of the tsquery, which PostgreSQL
				// walks recursively: tens of thousands of words exceed
				// its stack depth and fail the statement.
				err = fmt.Errorf("search too long (max %d bytes)", lim.MaxSearchBytes)
			case strings.IndexByte(f.Search, 0) >= 0:
				err = errSearchNUL
			}
		case filterAgentOwner:
			f.AgentOwner, err = d.agentOwner(count)
		default:
			name := string(k[1:])
			if _, dup := f.Tags[name]; dup {
				return fmt.Errorf("duplicate filter field %q", k)
			}
			var vals []string
			vals, err = d.tagValues(name, lim, count)
			if err == nil {
				if f.Tags == nil {
					f.Tags = make(map[string][]string, 1)
				}
				f.Tags[name] = vals
			}
		}
		if err != nil {
			return err
		}
		if d.consume(',') {
			continue
		}
		if d.consume('}') {
			return nil
		}
		return d.syntaxErr()
	}
}

// agentOwner reads the agent_owner value: null (no constraint) or one
// pubkey, which weighs one value like an author. Anything else is refused,
// never dropped: silently ignoring it would widen the read to every owner.
func (d *decoder) agentOwner(count func() error) (string, error) {
	bad := &FilterFieldError{Filter: -1, Field: "agent_owner", Reason: agentOwnerReason}
	if d.peek() == 'n' {
		if err := d.literal("null"); err != nil {
			return "", err
		}
		return "", nil
	}
	if d.peek() != '"' {
		return "", d.wrongType(bad)
	}
	b, err := d.appendStr(d.scratch[:0])
	d.scratch = b[:0]
	if err != nil {
		return "", err
	}
	if !isLowerHex(b, 64) {
		return "", bad
	}
	if err := count(); err != nil {
		return "", err
	}
	return string(b), nil
}

func isASCIILetter(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// hexList reads an array of 64-char lowercase hex strings.
func (d *decoder) hexList(bad error, count func() error) ([]string, error) {
	if !d.consume('[') {
		return nil, d.wrongType(bad)
	}
	out := []string{} // non-nil: present-but-empty differs from absent
	if d.consume(']') {
		return out, nil
	}
	for {
		if d.peek() != '"' {
			return nil, d.wrongType(bad)
		}
		b, err := d.appendStr(d.scratch[:0])
		d.scratch = b[:0]
		if err != nil {
			return nil, err
		}
		if !isLowerHex(b, 64) {
			return nil, bad
		}
		if err := count(); err != nil {
			return nil, err
		}
		out = append(out, string(b))
		if d.consume(',') {
			continue
		}
		if d.consume(']') {
			return out, nil
		}
		return nil, d.syntaxErr()
	}
}

func (d *decoder) kinds(count func() error) ([]int, error) {
	if !d.consume('[') {
		return nil, d.wrongType(errKinds)
	}
	out := []int{}
	if d.consume(']') {
		return out, nil
	}
	for {
		v, ok, err := d.intValue(MaxKind)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errKinds
		}
		if err := count(); err != nil {
			return nil, err
		}
		out = append(out, int(v))
		if d.consume(',') {
			continue
		}
		if d.consume(']') {
			return out, nil
		}
		return nil, d.syntaxErr()
	}
}

func (d *decoder) timestamp(bad error) (*int64, error) {
	v, ok, err := d.intValue(1<<63 - 1)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, bad
	}
	return &v, nil
}

func (d *decoder) tagValues(name string, lim *Limits, count func() error) ([]string, error) {
	bad := func() error { return fmt.Errorf("#%s must be an array of strings", name) }
	if !d.consume('[') {
		return nil, d.wrongType(bad())
	}
	out := []string{}
	if d.consume(']') {
		return out, nil
	}
	for {
		if d.peek() != '"' {
			return nil, d.wrongType(bad())
		}
		s, err := d.string()
		if err != nil {
			return nil, err
		}
		if lim.MaxTagValueLen > 0 && len(s) > lim.MaxTagValueLen {
			return nil, fmt.Errorf("#%s value too long (max %d bytes)", name, lim.MaxTagValueLen)
		}
		if strings.IndexByte(s, 0) >= 0 {
			// No stored tag holds NUL (PostgreSQL text cannot), and the
			// query would fail on it rather than match nothing.
			return nil, fmt.Errorf("#%s values must not contain NUL characters", name)
		}
		if err := count(); err != nil {
			return nil, err
		}
		out = append(out, s)
		if d.consume(',') {
			continue
		}
		if d.consume(']') {
			return out, nil
		}
		return nil, d.syntaxErr()
	}
}
