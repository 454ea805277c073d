package db

import "github.com/jackc/pgx/v5"

// QueueEventInsert queues the EventInsert statement on b, so that the group
// writer can send several inserts in one round trip; the queued command tag's
// RowsAffected is what EventInsert returns. Written by hand beside the
// generated code because sqlc's batch queries do not report rows affected.
func QueueEventInsert(b *pgx.Batch, arg EventInsertParams) *pgx.QueuedQuery {
	return b.Queue(eventInsert,
		arg.CommunityID,
		arg.ID,
		arg.Pubkey,
		arg.CreatedAt,
		arg.Kind,
		arg.Tags,
		arg.Content,
		arg.Sig,
		arg.ChannelID,
		arg.DTag,
	)
}
