package main

import "sync"

// waitingRoom holds the messages read off the subscription until handle
// gets to them, at most max in all. One shared first-come line would let
// whoever writes fastest (a member with many keys, or several members
// together) fill it and push out everyone else's mentions. Instead:
//   - the agent's owner is served first, always;
//   - then the channels take turns, and within a channel its authors take
//     turns, one message each;
//   - when it is full, a newcomer takes the place of the newest message of
//     the author holding the most in the channel holding the most, unless
//     the newcomer's channel (or, in that channel, its author) already
//     holds as many: then the newcomer is the one turned away.
//
// So a flood, from however many keys, costs the flooders' own channel and
// their own share of it, and a member writing at an ordinary pace keeps
// their place. A relay-signed doorbell is counted under the relay's key in
// its channel: its workflow's author is known only once it is verified.
type waitingRoom struct {
	mu       sync.Mutex
	max      int
	owner    string // the agent's owner, or ""
	ownerIn  []incoming
	channels []*waitingChannel // taking turns: the first is served next
	byID     map[string]*waitingChannel
	n        int           // messages held, the owner's included
	ready    chan struct{} // has a value when a message may be waiting
}

type waitingChannel struct {
	id      string
	authors []*waitingAuthor // taking turns: the first is served next
	byKey   map[string]*waitingAuthor
	n       int
}

type waitingAuthor struct {
	key string
	in  []incoming // oldest first
}

func newWaitingRoom(max int, owner string) *waitingRoom {
	return &waitingRoom{max: max, owner: owner, byID: map[string]*waitingChannel{}, ready: make(chan struct{}, 1)}
}

// add places in, or turns it away (accepted false). When it takes another
// message's place, that one is returned as pushedOut.
func (r *waitingRoom) add(in incoming) (accepted bool, pushedOut *incoming) {
	r.mu.Lock()
	defer r.mu.Unlock()
	author := in.ev.PubKey
	if author == r.owner && r.owner != "" {
		if r.n >= r.max {
			if pushedOut = r.pushOutLocked("", ""); pushedOut == nil {
				return false, nil // full of the owner's own
			}
		}
		r.ownerIn = append(r.ownerIn, in)
		r.n++
		r.signal()
		return true, pushedOut
	}
	channelID := tagValue(in.ev, "h")
	if r.n >= r.max {
		if pushedOut = r.pushOutLocked(channelID, author); pushedOut == nil {
			return false, nil
		}
	}
	c := r.byID[channelID]
	if c == nil {
		c = &waitingChannel{id: channelID, byKey: map[string]*waitingAuthor{}}
		r.byID[channelID] = c
		r.channels = append(r.channels, c)
	}
	a := c.byKey[author]
	if a == nil {
		a = &waitingAuthor{key: author}
		c.byKey[author] = a
		c.authors = append(c.authors, a)
	}
	a.in = append(a.in, in)
	c.n++
	r.n++
	r.signal()
	return true, pushedOut
}

// pushOutLocked removes the newest message of the author holding the most
// in the channel holding the most, to make room for one from author in
// channelID; nil when the newcomer's channel, or in that channel its
// author, already holds as many. author "" (the owner) always makes room
// while anyone else holds a place.
func (r *waitingRoom) pushOutLocked(channelID, author string) *incoming {
	var fullest *waitingChannel
	for _, c := range r.channels {
		if fullest == nil || c.n > fullest.n {
			fullest = c
		}
	}
	if fullest == nil {
		return nil
	}
	mine := r.byID[channelID]
	sameChannel := mine == fullest
	if author != "" && !sameChannel && mine != nil && mine.n >= fullest.n {
		return nil
	}
	var longest *waitingAuthor
	for _, a := range fullest.authors {
		if longest == nil || len(a.in) > len(longest.in) {
			longest = a
		}
	}
	if author != "" && sameChannel {
		if a := fullest.byKey[author]; a != nil && len(a.in) >= len(longest.in) {
			return nil
		}
	}
	out := longest.in[len(longest.in)-1]
	longest.in = longest.in[:len(longest.in)-1]
	fullest.n--
	r.n--
	if len(longest.in) == 0 {
		r.dropAuthorLocked(fullest, longest)
	}
	return &out
}

// next takes the message to handle next, or false when none waits.
func (r *waitingRoom) next() (incoming, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ownerIn) > 0 {
		in := r.ownerIn[0]
		r.ownerIn = r.ownerIn[1:]
		r.n--
		return in, true
	}
	if len(r.channels) == 0 {
		return incoming{}, false
	}
	c := r.channels[0]
	a := c.authors[0]
	in := a.in[0]
	a.in = a.in[1:]
	c.n--
	r.n--
	// Served: to the back of the line, author and channel both.
	if len(a.in) == 0 {
		r.dropAuthorLocked(c, a)
	} else {
		c.authors = append(c.authors[1:], a)
	}
	if c.n > 0 {
		r.channels = append(r.channels[1:], c)
	}
	return in, true
}

// dropAuthorLocked forgets an author with nothing waiting, and its channel
// when that leaves it empty, so what is held stays bounded by max.
func (r *waitingRoom) dropAuthorLocked(c *waitingChannel, a *waitingAuthor) {
	delete(c.byKey, a.key)
	c.authors = without(c.authors, a)
	if c.n == 0 {
		delete(r.byID, c.id)
		r.channels = without(r.channels, c)
	}
}

func without[T comparable](s []T, v T) []T {
	for i, x := range s {
		if x == v {
			return append(s[:i:i], s[i+1:]...)
		}
	}
	return s
}

func (r *waitingRoom) signal() {
	select {
	case r.ready <- struct{}{}:
	default:
	}
}
