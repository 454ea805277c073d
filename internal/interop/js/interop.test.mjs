// Interop checks driving a running Buzz relay with nostr-tools.
//
// Run by internal/interop/nostrtools_test.go with RELAY_URL set to a relay it
// started. Prints one JSON line per check ({"check", "ok", "error"}) and exits
// non-zero when any check fails. Every wait is bounded, so it cannot hang.
import assert from 'node:assert/strict'
import WebSocket from 'ws'
import { Relay, useWebSocketImplementation } from 'nostr-tools/relay'
import { finalizeEvent, generateSecretKey, getPublicKey, verifyEvent } from 'nostr-tools/pure'

// Node 20 has no global WebSocket; nostr-tools takes an implementation.
useWebSocketImplementation(WebSocket)

const RELAY_URL = process.env.RELAY_URL
const WAIT = 5000 // ms, for every single round trip

const now = () => Math.floor(Date.now() / 1000)

// within rejects when promise does not settle in ms.
function within(promise, what, ms = WAIT) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

// rejection returns the error message of a promise that must reject.
async function rejection(promise, what) {
  try {
    await within(promise, what)
  } catch (err) {
    return err.message
  }
  assert.fail(`${what}: expected the relay to refuse it`)
}

function newUser() {
  const sk = generateSecretKey()
  return { sk, pk: getPublicKey(sk), sign: async (template) => finalizeEvent(template, sk) }
}

const opened = []

// dial connects without authenticating.
async function dial() {
  const relay = new Relay(RELAY_URL)
  relay.onnotice = (msg) => console.error(`NOTICE: ${msg}`)
  opened.push(relay)
  await within(relay.connect({ timeout: WAIT }), 'connect')
  return relay
}

// connect authenticates through nostr-tools' onauth hook, which answers the
// challenge the relay sends on connect; relay.auth then returns that same
// in-flight AUTH and resolves on the relay's OK.
async function connect(user) {
  const relay = new Relay(RELAY_URL)
  relay.onnotice = (msg) => console.error(`NOTICE: ${msg}`)
  opened.push(relay)
  let challenged
  const gotChallenge = new Promise((resolve) => (challenged = resolve))
  relay.onauth = async (template) => {
    challenged()
    return user.sign(template)
  }
  await within(relay.connect({ timeout: WAIT }), 'connect')
  await within(gotChallenge, 'AUTH challenge')
  await within(relay.auth(relay.onauth), 'AUTH')
  return relay
}

function sign(user, kind, content, tags = [], created_at = now()) {
  return finalizeEvent({ kind, content, tags, created_at }, user.sk)
}

// publish sends an event, requires OK true and returns [event, OK message].
async function publish(relay, event) {
  const reason = await within(relay.publish(event), `publish kind ${event.kind}`)
  return [event, reason]
}

// fetch returns the stored events for filters, ended by a real EOSE (the
// library's own EOSE timer is pushed past ours).
function fetch(relay, filters) {
  const events = []
  let sub
  const done = new Promise((resolve, reject) => {
    sub = relay.subscribe(filters, {
      eoseTimeout: 10 * WAIT,
      onevent: (ev) => events.push(ev),
      oninvalidevent: (ev) => reject(new Error(`relay sent an event not matching ${JSON.stringify(filters)}: ${JSON.stringify(ev)}`)),
      oneose: () => resolve(events),
      onclose: (reason) => reject(new Error(`REQ ${JSON.stringify(filters)} closed before EOSE: ${reason}`)),
    })
  })
  return within(done, `EOSE for ${JSON.stringify(filters)}`).finally(() => {
    sub.onclose = undefined
    sub.close()
  })
}

const ids = (events) => events.map((e) => e.id)
const sorted = (list) => [...list].sort()

// live opens a subscription and returns next(), which waits for its next
// event; ready resolves on EOSE.
function live(relay, filters) {
  const queue = []
  const waiters = []
  let failure
  let eosed
  const ready = new Promise((resolve) => (eosed = resolve))
  const fail = (err) => {
    failure = err
    while (waiters.length) waiters.shift().reject(err)
  }
  const sub = relay.subscribe(filters, {
    eoseTimeout: 10 * WAIT,
    onevent: (ev) => (waiters.length ? waiters.shift().resolve(ev) : queue.push(ev)),
    oninvalidevent: (ev) => fail(new Error(`relay sent an event not matching the filter: ${JSON.stringify(ev)}`)),
    oneose: () => eosed(),
    onclose: (reason) => fail(new Error(`subscription closed: ${reason}`)),
  })
  const next = (what) => {
    if (failure) return Promise.reject(failure)
    if (queue.length) return Promise.resolve(queue.shift())
    return within(new Promise((resolve, reject) => waiters.push({ resolve, reject })), what)
  }
  const close = () => {
    sub.onclose = undefined
    sub.close()
  }
  return { ready: within(ready, 'EOSE'), next, close, queue }
}

// relayInfo reads the relay's NIP-11 document.
async function relayInfo() {
  const res = await globalThis.fetch(RELAY_URL.replace(/^ws/, 'http'), { headers: { Accept: 'application/nostr+json' } })
  return res.json()
}

let failed = false
async function check(name, fn) {
  try {
    await fn()
    console.log(JSON.stringify({ check: name, ok: true }))
  } catch (err) {
    failed = true
    console.log(JSON.stringify({ check: name, ok: false, error: String(err?.stack || err) }))
  }
}

await check('auth-required', async () => {
  const user = newUser()
  const relay = await dial()
  const note = sign(user, 1, 'before auth')
  assert.match(await rejection(relay.publish(note), 'EVENT before AUTH'), /^auth-required:/)
  assert.match(await rejection(relay.count([{ kinds: [1] }], {}), 'COUNT before AUTH'), /^auth-required:/)
  const closed = new Promise((resolve, reject) => {
    relay.subscribe([{ kinds: [1] }], {
      eoseTimeout: 10 * WAIT,
      onevent: (ev) => reject(new Error(`REQ before AUTH got ${JSON.stringify(ev)}`)),
      oneose: () => reject(new Error('REQ before AUTH reached EOSE')),
      onclose: resolve,
    })
  })
  assert.match(await within(closed, 'CLOSED for REQ before AUTH'), /^auth-required:/)

  // nostr-tools' explicit flow: AUTH after the refusal, then retry.
  await within(relay.auth(user.sign), 'AUTH')
  await publish(relay, note)
  assert.deepEqual(ids(await fetch(relay, [{ ids: [note.id] }])), [note.id])

  const forged = sign(newUser(), 1, 'signed by another key')
  assert.match(await rejection(relay.publish(forged), 'EVENT by another pubkey'), /^restricted:/)
})

await check('publish-subscribe', async () => {
  const user = newUser()
  const relay = await connect(user)
  const base = now() - 100
  const [e1] = await publish(relay, sign(user, 1, 'hello from nostr-tools', [['t', 'interop']], base))
  const [e2] = await publish(relay, sign(user, 1, 'second', [['t', 'other']], base + 1))
  const [e3] = await publish(relay, sign(user, 1, 'third', [['t', 'interop']], base + 2))

  const [got] = await fetch(relay, [{ ids: [e1.id] }])
  assert.ok(verifyEvent(got), 'returned event verifies')
  for (const field of ['id', 'pubkey', 'created_at', 'kind', 'tags', 'content', 'sig']) {
    assert.deepEqual(got[field], e1[field], field)
  }
  assert.deepEqual(sorted(ids(await fetch(relay, [{ kinds: [1], authors: [user.pk] }]))), sorted([e1.id, e2.id, e3.id]))
  assert.deepEqual(sorted(ids(await fetch(relay, [{ '#t': ['interop'] }]))), sorted([e1.id, e3.id]))
  assert.deepEqual(ids(await fetch(relay, [{ authors: [user.pk], limit: 2 }])), [e3.id, e2.id])
  assert.deepEqual(ids(await fetch(relay, [{ authors: [user.pk], since: base + 1, until: base + 1 }])), [e2.id])
  assert.deepEqual(await fetch(relay, [{ kinds: [1], authors: [newUser().pk] }]), [])
  // Several filters in one REQ are a union.
  assert.deepEqual(sorted(ids(await fetch(relay, [{ ids: [e1.id] }, { '#t': ['other'] }]))), sorted([e1.id, e2.id]))
})

await check('live-subscription', async () => {
  const reader = newUser()
  const writer = newUser()
  const r = await connect(reader)
  const w = await connect(writer)
  const [stored] = await publish(w, sign(writer, 1, 'stored', [], now() - 10))
  const sub = live(r, [{ kinds: [1], authors: [writer.pk] }])
  assert.equal((await sub.next('stored event')).id, stored.id)
  await sub.ready
  const [later] = await publish(w, sign(writer, 1, 'published after EOSE'))
  assert.equal((await sub.next('live event')).id, later.id)
  await publish(r, sign(reader, 1, 'not by the writer'))
  const [last] = await publish(w, sign(writer, 1, 'last'))
  assert.equal((await sub.next('last live event')).id, last.id)
  sub.close()
})

await check('ephemeral', async () => {
  const reader = newUser()
  const writer = newUser()
  const r = await connect(reader)
  const w = await connect(writer)
  const sub = live(r, [{ kinds: [20001], authors: [writer.pk] }])
  await sub.ready
  assert.equal(sub.queue.length, 0)
  const [eph] = await publish(w, sign(writer, 20001, 'ephemeral'))
  assert.equal((await sub.next('ephemeral event')).id, eph.id)
  sub.close()
  assert.deepEqual(await fetch(r, [{ ids: [eph.id] }]), [])
  assert.deepEqual(await fetch(r, [{ kinds: [20001] }]), [])
})

await check('count', async () => {
  const user = newUser()
  const relay = await connect(user)
  const base = now() - 50
  const notes = []
  for (let i = 0; i < 3; i++) notes.push(await publish(relay, sign(user, 1, `note ${i}`, [['t', 'counted']], base + i)))
  // A NIP-25 reaction needs its target (the relay checks it exists).
  await publish(relay, sign(user, 7, '+', [['e', notes[0][0].id]], base + 5))
  assert.equal(await within(relay.count([{ '#t': ['counted'] }], {}), 'COUNT #t'), 3)
  assert.equal(await within(relay.count([{ authors: [user.pk] }], {}), 'COUNT authors'), 4)
  assert.equal(await within(relay.count([{ kinds: [1], authors: [user.pk], since: base + 1 }], {}), 'COUNT since'), 2)
  assert.equal(await within(relay.count([{ authors: [newUser().pk] }], {}), 'COUNT nobody'), 0)
})

await check('replaceable', async () => {
  const user = newUser()
  const relay = await connect(user)
  const t = now()
  const profile = [{ kinds: [0], authors: [user.pk] }]
  const [v1] = await publish(relay, sign(user, 0, '{"name":"first"}', [], t - 20))
  const [v2] = await publish(relay, sign(user, 0, '{"name":"second"}', [], t - 10))
  assert.deepEqual(ids(await fetch(relay, profile)), [v2.id])
  const [, again] = await publish(relay, v1)
  assert.match(again, /^duplicate:/)
  assert.deepEqual(ids(await fetch(relay, profile)), [v2.id])
  assert.equal(await within(relay.count(profile, {}), 'COUNT kind 0'), 1)
})

await check('addressable', async () => {
  const user = newUser()
  const relay = await connect(user)
  const t = now()
  const articles = [{ kinds: [30023], authors: [user.pk] }]
  const [a1] = await publish(relay, sign(user, 30023, 'draft', [['d', 'alpha']], t - 30))
  const [b1] = await publish(relay, sign(user, 30023, 'beta', [['d', 'beta']], t - 25))
  const [a2] = await publish(relay, sign(user, 30023, 'final', [['d', 'alpha']], t - 20))
  assert.deepEqual(sorted(ids(await fetch(relay, articles))), sorted([a2.id, b1.id]))
  assert.deepEqual(ids(await fetch(relay, [{ kinds: [30023], authors: [user.pk], '#d': ['alpha'] }])), [a2.id])
  const [, again] = await publish(relay, a1)
  assert.match(again, /^duplicate:/)
  assert.deepEqual(sorted(ids(await fetch(relay, articles))), sorted([a2.id, b1.id]))
})

await check('deletion', async () => {
  const user = newUser()
  const relay = await connect(user)
  const t = now()
  const notes = [{ kinds: [1], authors: [user.pk] }]
  const [gone] = await publish(relay, sign(user, 1, 'to be deleted', [], t - 30))
  const [kept] = await publish(relay, sign(user, 1, 'kept', [], t - 29))
  const [del] = await publish(relay, sign(user, 5, '', [['e', gone.id], ['k', '1']], t - 28))
  assert.deepEqual(ids(await fetch(relay, notes)), [kept.id])
  assert.deepEqual(await fetch(relay, [{ ids: [gone.id] }]), [])
  assert.equal(await within(relay.count(notes, {}), 'COUNT after deletion'), 1)
  assert.deepEqual(ids(await fetch(relay, [{ kinds: [5], authors: [user.pk] }])), [del.id])

  const [post] = await publish(relay, sign(user, 30023, 'post', [['d', 'post']], t - 20))
  await publish(relay, sign(user, 5, '', [['a', `30023:${user.pk}:post`]], t - 10))
  assert.deepEqual(await fetch(relay, [{ kinds: [30023], authors: [user.pk] }]), [])
  assert.deepEqual(await fetch(relay, [{ ids: [post.id] }]), [])
  const [repost] = await publish(relay, sign(user, 30023, 'rewritten', [['d', 'post']], t))
  assert.deepEqual(ids(await fetch(relay, [{ kinds: [30023], authors: [user.pk] }])), [repost.id])
})

// An event within the advertised max_content_length (characters) can exceed
// max_message_length (bytes): 65,536 four-byte characters. nostr-tools
// writes the id after the content; the refusal must still be the OK the
// publish waits for, and a REQ too large to read gets its CLOSED.
await check('oversized', async () => {
  const user = newUser()
  const relay = await connect(user)
  const info = await within(relayInfo(), 'NIP-11')
  const max = info.limitation.max_content_length
  const article = sign(user, 30023, '\u{1F600}'.repeat(max), [['d', 'long']])
  assert.match(await rejection(relay.publish(article), 'oversized EVENT'), /^invalid: message of \d+ bytes exceeds the \d+-byte limit$/)
  const closed = new Promise((resolve, reject) => {
    relay.subscribe([{ '#t': ['x'.repeat(info.limitation.max_message_length)] }], {
      eoseTimeout: 10 * WAIT,
      oneose: () => reject(new Error('oversized REQ reached EOSE')),
      onclose: resolve,
    })
  })
  assert.match(await within(closed, 'CLOSED for an oversized REQ'), /^invalid: message of \d+ bytes exceeds/)
  // The connection stays usable.
  const [note] = await publish(relay, sign(user, 1, 'after the oversized ones'))
  assert.deepEqual(ids(await fetch(relay, [{ ids: [note.id] }])), [note.id])
})

// Time and versions as NIP-01 clients expect them: two versions of a slot
// with one created_at keep the lowest id whichever arrives first; a missing,
// empty or value-less d tag is one address; limit 0 is an EOSE, then live
// events; COUNT over overlapping filters counts each event once.
await check('versions-and-limits', async () => {
  const user = newUser()
  const relay = await connect(user)
  const t = now()
  const profile = [{ kinds: [0], authors: [user.pk] }]
  const [a, b] = [sign(user, 0, '{"name":"a"}', [], t - 50), sign(user, 0, '{"name":"b"}', [], t - 50)]
  const [low, high] = a.id < b.id ? [a, b] : [b, a]
  await publish(relay, high)
  await publish(relay, low)
  const [, again] = await publish(relay, high)
  assert.match(again, /^duplicate:/)
  assert.deepEqual(ids(await fetch(relay, profile)), [low.id])

  const slot = [{ kinds: [30023], authors: [user.pk] }]
  await publish(relay, sign(user, 30023, 'no d', [], t - 40))
  await publish(relay, sign(user, 30023, 'empty d', [['d', '']], t - 30))
  const [bare] = await publish(relay, sign(user, 30023, 'bare d', [['d']], t - 20))
  assert.deepEqual(ids(await fetch(relay, slot)), [bare.id])

  const sub = live(relay, [{ authors: [user.pk], limit: 0 }])
  await sub.ready
  assert.equal(sub.queue.length, 0, 'limit 0 sends no stored event')
  const [note] = await publish(relay, sign(user, 1, 'live after limit 0'))
  assert.equal((await sub.next('live event after limit 0')).id, note.id)
  sub.close()

  const overlap = [{ authors: [user.pk] }, { kinds: [1], authors: [user.pk] }]
  assert.equal(await within(relay.count(overlap, {}), 'COUNT overlapping filters'), 3)
})

for (const relay of opened) relay.close()
process.exit(failed ? 1 : 0)
