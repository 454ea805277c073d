package relay

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the relay's Prometheus collectors, registered on their own
// registry so tests can run several relays in one process.
type Metrics struct {
	Registry        *prometheus.Registry
	Connections     prometheus.Gauge
	EventsAccepted  *prometheus.CounterVec // outcome: stored, duplicate, superseded, relayed
	EventsRejected  *prometheus.CounterVec // reason: the NIP-01 prefix
	ReqDuration     *prometheus.HistogramVec
	FanoutDelivered prometheus.Counter
	FanoutDropped   prometheus.Counter
	// EventsExpiredPurged counts expired (NIP-40) events deleted.
	EventsExpiredPurged prometheus.Counter
	// FanoutWriteDelay is the time from a live event queued for a
	// subscriber to its socket write.
	FanoutWriteDelay prometheus.Histogram
	SlowClosed       prometheus.Counter
	ConnsRefused     *prometheus.CounterVec // reason: total, address, handshake_rate
	// WebhookCallsRefused counts workflow webhook calls refused by a cap
	// of calls being answered, by cap (total, address).
	WebhookCallsRefused *prometheus.CounterVec
	ReplyQueueBytes     prometheus.Gauge
	AuthTimeouts        prometheus.Counter
	AuthRateLimited     prometheus.Counter
	MessagesPaced       prometheus.Counter
	PingsPaced          prometheus.Counter
	HTTPAuthRateLimited prometheus.Counter
	// HTTPAuthSignaturesChecked counts the signatures of signed HTTP
	// requests (and their x-auth-tag attestations) actually verified.
	HTTPAuthSignaturesChecked prometheus.Counter
	// HTTPAuthReleaseFailures counts NIP-98 claims a request that failed
	// for the relay's reason could not give back: its client signs anew.
	HTTPAuthReleaseFailures prometheus.Counter
	RateLimited             prometheus.Counter
	DBQuery                 *prometheus.HistogramVec // query: the statement's name
	// OwnerAttestations counts owner attestations presented on AUTH or in
	// x-auth-tag, by result: recorded, conflict, invalid, unsigned.
	OwnerAttestations *prometheus.CounterVec
	MediaRequests     *prometheus.CounterVec // op: upload, get, head, delete; status: the HTTP status code
	MediaBytes        *prometheus.CounterVec // direction: in (request bodies), out (responses)
	// MediaQuotaReleaseFailures counts failed attempts to give a media
	// quota reservation back, by outcome: retried (another attempt
	// follows), lost (the last attempt failed: the community's count stays
	// high until an operator corrects it).
	MediaQuotaReleaseFailures *prometheus.CounterVec
	// MediaSweepBlobs counts the unreferenced blobs the media sweep
	// removed, and its removals that failed (each tried again next sweep).
	MediaSweepBlobs *prometheus.CounterVec
	// CommunityClosedConns counts connections closed because their
	// community was deleted or archived, by close reason.
	CommunityClosedConns *prometheus.CounterVec
	// RouteDecision counts routed reads by path, decision (replica,
	// writer) and reason (docs/replica.md).
	RouteDecision *prometheus.CounterVec
	// Group commit: events per group written, how long a group's oldest
	// event waited for a writer, how long a group took to commit, and
	// groups that failed whole (their events then ran alone).
	IngestGroupEvents  prometheus.Histogram
	IngestGroupWait    prometheus.Histogram
	IngestGroupSeconds prometheus.Histogram
	IngestGroupsFailed prometheus.Counter
	// IngestChangesAlone counts changes the group writer handed on to run
	// alone, in their channel's line.
	IngestChangesAlone prometheus.Counter
	// ChannelMemberLimitRefusals counts adds refused because their channel
	// is at BUZZ_MAX_CHANNEL_MEMBERS (also in EventsRejected, as restricted).
	ChannelMemberLimitRefusals prometheus.Counter
}

// latencyBuckets spans half a millisecond to five seconds, doubling: a
// request or a statement is timed on the same scale.
var latencyBuckets = []float64{.0005, .001, .002, .004, .008, .016, .032, .064, .128, .256, .512, 1, 2, 5}

// fanoutBuckets span a tenth of a millisecond to a second: a delivery to an
// idle connection leaves in microseconds, one behind a thousand others in
// milliseconds, and one to a slow client waits up to the write timeout.
var fanoutBuckets = []float64{.0001, .00025, .0005, .001, .002, .004, .008, .016, .032, .064, .128, .256, .512, 1}

// groupSizeBuckets count events per group, doubling up to BUZZ_INGEST_GROUP_MAX's
// usual range.
var groupSizeBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128}

// NewMetrics creates and registers the relay's collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "buzz_connections", Help: "Open WebSocket connections.",
		}),
		EventsAccepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_events_accepted_total", Help: "Events accepted, by outcome.",
		}, []string{"outcome"}),
		EventsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_events_rejected_total", Help: "Events rejected, by NIP-01 reason prefix.",
		}, []string{"reason"}),
		ReqDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "buzz_req_duration_seconds",
			Help:    "Time from REQ/COUNT received to EOSE/COUNT sent.",
			Buckets: latencyBuckets,
		}, []string{"verb"}),
		FanoutDelivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_fanout_delivered_total", Help: "Live events queued to subscribers.",
		}),
		FanoutDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_fanout_dropped_total", Help: "Live events not queued because the subscriber's send queue was full.",
		}),
		EventsExpiredPurged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_events_expired_purged_total", Help: "Expired (NIP-40) events deleted by this process's purge.",
		}),
		FanoutWriteDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "buzz_fanout_write_delay_seconds",
			Help:    "Time from a live event queued for a subscriber to its write to the subscriber's socket.",
			Buckets: fanoutBuckets,
		}),
		SlowClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_slow_clients_closed_total", Help: "Connections closed because they could not keep up.",
		}),
		ConnsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_connections_refused_total", Help: "WebSocket upgrades refused by a connection cap (total, address) or by the client address's rate of new connections (handshake_rate).",
		}, []string{"reason"}),
		WebhookCallsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_webhook_calls_refused_total", Help: "Workflow webhook calls refused by a cap of calls being answered, by cap (total, address).",
		}, []string{"reason"}),
		ReplyQueueBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "buzz_reply_queue_bytes", Help: "Bytes of replies (history, OK ...) queued for clients and not yet written, all connections together.",
		}),
		AuthTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_auth_timeouts_total", Help: "Connections closed because they did not authenticate in time.",
		}),
		AuthRateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_auth_rate_limited_total", Help: "AUTH messages refused unverified because their connection had no signature checks left.",
		}),
		MessagesPaced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_messages_paced_total", Help: "Times a connection's next message waited because it had sent its messages per second.",
		}),
		PingsPaced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_pings_paced_total", Help: "Times a connection's ping waited for its pong because it had sent its pings per second.",
		}),
		HTTPAuthRateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_http_auth_rate_limited_total", Help: "Signed HTTP requests refused unverified because their address had sent its bad signatures.",
		}),
		HTTPAuthSignaturesChecked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_http_auth_signatures_checked_total", Help: "Signatures of signed HTTP requests verified (a signature that verified within the auth window is not checked again).",
		}),
		HTTPAuthReleaseFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_http_auth_release_failures_total", Help: "NIP-98 claims a request that failed for the relay's reason could not give back (its client must sign the request again); during a database outage they are counted here and not logged one by one.",
		}),
		RateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_publish_rate_limited_total", Help: "Events refused because their pubkey published too fast.",
		}),
		DBQuery: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "buzz_db_query_seconds",
			Help:    "Time spent in one database statement, by the statement's name.",
			Buckets: latencyBuckets,
		}, []string{"query"}),
		OwnerAttestations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_owner_attestations_total",
			Help: "Owner attestations (auth tags) presented when authenticating, by result: recorded, conflict (a different owner is on record), invalid, unsigned (an x-auth-tag header its request did not sign, for an agent with no owner: nothing recorded).",
		}, []string{"result"}),
		MediaRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_media_requests_total", Help: "Blossom media requests, by operation and HTTP status.",
		}, []string{"op", "status"}),
		MediaBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_media_bytes_total", Help: "Media bytes read from uploads (in) and written to clients (out).",
		}, []string{"direction"}),
		MediaQuotaReleaseFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_media_quota_release_failures_total", Help: "Failed attempts to give a media quota reservation back, by outcome: retried, lost (the community's count stays high), abandoned (still being retried when Shutdown's time ran out, at most; the count stays high). A retried attempt that failed for a database outage is counted here, not logged.",
		}, []string{"outcome"}),
		MediaSweepBlobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_media_sweep_blobs_total", Help: "Blobs no community references, by what the media sweep did: removed, failed (logged; tried again by the next sweep).",
		}, []string{"outcome"}),
		CommunityClosedConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_connections_closed_community_total", Help: "WebSocket connections closed with 1008 because their community was deleted or archived, by close reason.",
		}, []string{"reason"}),
	}
	m.RouteDecision = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "buzz_db_route_decision",
		Help: "Reads that could be served by the read replica, by path, where they went (replica, writer) and why.",
	}, []string{"path", "decision", "reason"})
	m.IngestGroupEvents = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "buzz_ingest_group_events",
		Help:    "Events per group committed together (group commit); a lone event, or one written alone after its group could not settle it, is a group of one. Groups that failed whole are not observed here.",
		Buckets: groupSizeBuckets,
	})
	m.IngestGroupWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "buzz_ingest_group_wait_seconds",
		Help:    "How long the oldest event of a group waited for a group writer (zero for an event written at once); a change run alone in its channel's line, from its arrival to its turn.",
		Buckets: append(fanoutBuckets[:len(fanoutBuckets):len(fanoutBuckets)], 2, 5, 10, 30),
	})
	m.IngestGroupSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "buzz_ingest_group_seconds",
		Help:    "Time to write and commit one group of events, round trips and commit included.",
		Buckets: fanoutBuckets,
	})
	m.IngestGroupsFailed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buzz_ingest_groups_failed_total",
		Help: "Groups that failed as a whole (a lost connection, a deferred constraint at COMMIT, or a lock wait, deadlock or serialization failure in a group of plain events, which is one statement); each of their events was then written alone.",
	})
	m.IngestChangesAlone = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buzz_ingest_changes_alone_total",
		Help: "Membership and metadata changes and workflow saves the group writer handed on to run alone, one at a time per channel: their short wait for the channel's row ran out (a large channel's list fold or another change held it), changes of the channel already waited alone, or their group failed.",
	})
	m.ChannelMemberLimitRefusals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buzz_channel_member_limit_refusals_total",
		Help: "Joins and put-users refused because their channel has BUZZ_MAX_CHANNEL_MEMBERS active members.",
	})
	m.Registry.MustRegister(m.ChannelMemberLimitRefusals, m.IngestGroupEvents, m.IngestGroupWait, m.IngestGroupSeconds, m.IngestGroupsFailed, m.IngestChangesAlone, m.RouteDecision, m.CommunityClosedConns, m.MediaRequests, m.MediaBytes, m.MediaQuotaReleaseFailures, m.MediaSweepBlobs, m.OwnerAttestations, m.Connections, m.EventsAccepted, m.EventsRejected, m.ReqDuration,
		m.FanoutDelivered, m.FanoutDropped, m.EventsExpiredPurged, m.FanoutWriteDelay, m.SlowClosed, m.ConnsRefused, m.WebhookCallsRefused, m.ReplyQueueBytes, m.AuthTimeouts, m.AuthRateLimited, m.MessagesPaced, m.PingsPaced, m.HTTPAuthRateLimited, m.HTTPAuthSignaturesChecked, m.HTTPAuthReleaseFailures, m.RateLimited, m.DBQuery,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// watchIngestQueue registers the gauge of events waiting for a group
// writer, read from waiting at each scrape.
func (m *Metrics) watchIngestQueue(waiting func() int) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "buzz_ingest_waiting_events",
		Help: "Events waiting for a group writer now (BUZZ_INGEST_QUEUE caps it).",
	}, func() float64 { return float64(waiting()) }))
}
