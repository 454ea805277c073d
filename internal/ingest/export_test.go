package ingest

import "sort"

// RegisteredKinds lists the kinds p has a handler for, sorted, so tests can
// cover every one of them (and a kind registered later with them).
func RegisteredKinds(p *Pipeline) []int {
	kinds := make([]int, 0, len(p.handlers))
	for kind := range p.handlers {
		kinds = append(kinds, kind)
	}
	sort.Ints(kinds)
	return kinds
}

// OnListClaimed makes FoldChannelLists call fn once it holds a mark, before
// it writes the lists.
func OnListClaimed(p *Pipeline, fn func()) { p.onListClaimed = fn }

// OnListsLocked makes FoldChannelLists call fn while it holds the channel's
// row, before it writes the lists: a fold in progress.
func OnListsLocked(p *Pipeline, fn func()) { p.onListsLocked = fn }

// OnListFoldPass makes RunListFolder call fn after each of its passes.
func OnListFoldPass(p *Pipeline, fn func()) { p.onListFoldPass = fn }

// ChangesWaitingTheirTurn is how many changes wait in their channel's line
// for their turn to run alone (holding no connection).
func ChangesWaitingTheirTurn(p *Pipeline) int { return int(p.changeLines.waiting.Load()) }

// DeletionOfModerationRefused is the text of a deletion refused for naming a
// channel's moderation event.
const DeletionOfModerationRefused = deletionOfModerationRefused
