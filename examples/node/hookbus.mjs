// A small HookBus client for Node.js, written from docs/protocol.md (wire protocol v3).
//
// It plays the "agent using the coordinator service" role (protocol.md, section 10), in one of
// two tiers (protocol.md 6.3, docs/security.md):
//
// * an UNTRUSTED agent of a tenant (`tenant` given): it may only XADD to its tenant's stream and
//   pop its tenant's inboxes, so everything goes through the coordinator service:
//     decide(event, context)  XADD {p}:t:{TENANT}:decisions  a DecisionRequest (3.5, 6.3), then
//                             BLPOP {p}:t:{TENANT}:inbox:{client id} until the DecisionReply (3.6)
//     emit(event, context)    the same: the service dispatches the event and publishes it (6.1)
//     cancel(session)         XADD {p}:t:{TENANT}:decisions  a CancelRequest (3.10, 6.6)
// * a TRUSTED agent (no tenant): the platform's own runtime, with the `agent` credential:
//     emit(event, context)    XADD {p}:events:{TAG}     an EventMessage (3.1, 6.1)
//     decide(event, context)  XADD {p}:decisions:{TAG}  a DecisionRequest, then BLPOP
//                             {p}:inbox:{client id}
//     cancel(session)         XADD {p}:decisions:{TAG}  a CancelRequest
//   where TAG is the hash tag of the session's partition (section 2; `partitions` =
//   HOOKBUS_PARTITIONS of the bus, default 1).
//
// A `redis+cluster://` (or `rediss+cluster://`) URL connects to a Redis Cluster with node-redis'
// cluster client (section 9); every command names one key, so it works unchanged there.
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { crc32 } from 'node:zlib';
import { createClient, createCluster } from 'redis';

export const PROTOCOL_VERSION = 3;

// The 12 lifecycle events (section 4.1).
export const EVENTS = Object.freeze([
  'OnSessionStart', 'PreToolUse', 'PostToolUse', 'PostToolUseFailure', 'OnStepComplete',
  'OnSessionStop', 'OnSubagentStart', 'OnSubagentStop', 'OnPreCompact', 'OnPostCompact',
  'PermissionRequest', 'PermissionDenied',
]);

const NAME = /^[A-Za-z0-9_.-]{1,128}$/; // prefix rule (section 1.6)
const TENANT = /^[A-Za-z0-9_-]{1,64}$/; // tenant rule (section 1.6)
const MAX_PARTITIONS = 1024; // section 2
const SLOTS = 16384; // Redis Cluster hash slots
const EVENTS_CAP = 1_000_000; // backstop MAXLEN ~ for {p}:events:{TAG} (6.1, 6.8)
const DECISIONS_CAP = 100_000; // nothing else trims a decisions stream (8.5)
const POP_SECONDS = 0.5; // one BLPOP round; deadlines are kept by timers

/** 128 random bits as 32 lowercase hex characters (section 1.3). */
export function newId() {
  return randomBytes(16).toString('hex');
}

/** The session an event belongs to (section 3.1): subagent events use the parent's. */
export function sessionOf(event, context) {
  const subagent = event === 'OnSubagentStart' || event === 'OnSubagentStop';
  return String((subagent ? context.parent_session_id : context.session_id) ?? '');
}

/** CRC16-XMODEM of the bytes, as Redis Cluster hashes keys. */
function crc16(bytes) {
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc;
}

/** The cluster slot of a hash tag (a key without braces hashes whole). */
export function slotOf(tag) {
  return crc16(Buffer.from(tag, 'utf8')) % SLOTS;
}

/**
 * The hash tag of partition `index` of `partitions` (section 2): the first `<kind><index>.<k>`,
 * k = 0, 1, …, whose slot lies in the index-th of `partitions` equal slot ranges.
 */
export function partitionTag(kind, index, partitions) {
  const low = Math.floor((index * SLOTS) / partitions);
  const high = Math.floor(((index + 1) * SLOTS) / partitions);
  for (let k = 0; k < 1_000_000; k++) {
    const tag = `${kind}${index}.${k}`;
    const slot = slotOf(tag);
    if (slot >= low && slot < high) return tag;
  }
  throw new Error(`no hash tag found for partition ${index} of ${partitions}`);
}

/** A session's partition: crc32(UTF-8 session id) mod N (section 2). */
export function partitionOf(sessionId, partitions) {
  return partitions === 1 ? 0 : crc32(Buffer.from(sessionId, 'utf8')) % partitions;
}

/** The keys a client uses (section 2). */
export function keysOf({ prefix = 'hookbus', tenant = '', partitions = 1, clientId }) {
  if (!NAME.test(prefix)) throw new Error(`invalid key prefix ${JSON.stringify(prefix)}`);
  if (tenant && !TENANT.test(tenant)) {
    throw new Error(`tenant ${JSON.stringify(tenant)} must be 1-64 characters of letters, digits, '_' or '-'`);
  }
  if (!Number.isInteger(partitions) || partitions < 1 || partitions > MAX_PARTITIONS) {
    throw new Error(`partitions must be 1-${MAX_PARTITIONS}, not ${partitions}`);
  }
  if (tenant) {
    // An untrusted agent's keys share its tenant's hash tag: one slot, one ACL pattern.
    const decisions = `${prefix}:t:{${tenant}}:decisions`;
    return {
      tenant,
      decisions: () => decisions,
      events: null,
      inbox: `${prefix}:t:{${tenant}}:inbox:${clientId}`,
    };
  }
  const tags = (kind) => Array.from({ length: partitions }, (_, i) => partitionTag(kind, i, partitions));
  const events = tags('e').map((tag) => `${prefix}:events:{${tag}}`);
  const decisions = tags('d').map((tag) => `${prefix}:decisions:{${tag}}`);
  return {
    tenant: '',
    decisions: (session) => decisions[partitionOf(session, partitions)],
    events: (session) => events[partitionOf(session, partitions)],
    inbox: `${prefix}:inbox:${clientId}`,
  };
}

// Give up after ~5 s without a server instead of retrying forever.
const reconnectStrategy = (retries, cause) => (retries >= 10 ? cause : Math.min(100 * (retries + 1), 1000));

/** One Redis connection (or cluster client) for the URL; `+cluster` schemes name a cluster. */
function connectTo(url) {
  const match = /^(rediss?)\+cluster:\/\//.exec(url);
  if (!match) return createClient({ url, socket: { connectTimeout: 5000, reconnectStrategy } });
  const plain = url.replace('+cluster', '');
  const parsed = new URL(plain);
  // Connections to the discovered nodes take only `defaults` (credentials, TLS), not the URL's.
  return createCluster({
    rootNodes: [{ url: plain }],
    defaults: {
      username: parsed.username ? decodeURIComponent(parsed.username) : undefined,
      password: parsed.password ? decodeURIComponent(parsed.password) : undefined,
      socket: { connectTimeout: 5000, reconnectStrategy, tls: match[1] === 'rediss' },
    },
  });
}

export class HookBus {
  /**
   * Connect to Redis:
   * `await HookBus.connect('redis://tenant-acme:PASSWORD@127.0.0.1:6379/0', { tenant: 'acme' })`.
   */
  static async connect(url, options = {}) {
    return new HookBus(url, options).connect();
  }

  constructor(url, { prefix = 'hookbus', source = 'node-agent', clientId, tenant = '', partitions = 1 } = {}) {
    this.prefix = prefix;
    this.source = source;
    this.clientId = clientId ?? `node-${hostname()}-${process.pid}-${newId().slice(0, 6)}`;
    this.partitions = partitions;
    this.keys = keysOf({ prefix, tenant, partitions, clientId: this.clientId });
    this.tenant = this.keys.tenant;
    // One connection for commands, one for the blocking pops (section 6.3, client rules).
    this.redis = connectTo(url);
    this.blocking = this.redis.duplicate();
    for (const c of [this.redis, this.blocking]) c.on('error', (e) => { this.lastError = e; });
    this.waiting = new Map(); // request id -> { resolve, reject, timer }
    this.popping = null;
  }

  /** Open both connections (`HookBus.connect` does it for you). */
  async connect() {
    await Promise.all([this.redis.connect(), this.blocking.connect()]);
    if (!this.tenant) await this.checkPartitions();
    return this;
  }

  /**
   * The partition count is the bus's shared configuration (section 2, key layout 3): the hash
   * `{p}:config`, field `partitions`, written once by the first process (HSETNX). A trusted
   * agent on another count would send its decisions where no coordinator reads them: refuse to
   * start, with one line naming both. (A tenant's keys are not partitioned: its user may not
   * read it and need not.)
   */
  async checkPartitions() {
    const config = `${this.prefix}:config`;
    try {
      await this.redis.hSetNX(config, 'partitions', String(this.partitions));
    } catch (e) {
      if (!/NOPERM/.test(String(e))) throw e; // a user that may only read it
    }
    const value = await this.redis.hGet(config, 'partitions');
    if (value != null && Number(value) !== this.partitions) {
      await this.close();
      throw new Error(
        `this process has partitions=${this.partitions} but the bus (prefix ${this.prefix}) has ` +
          `${value} partitions (${config} partitions): start it with partitions ${value}`,
      );
    }
  }

  #envelope() {
    return { v: PROTOCOL_VERSION, id: newId(), ts: Date.now(), traceparent: '', tracestate: '' };
  }

  /**
   * Publish one lifecycle event; resolves to { id, entry } (trusted), or { id, entry, reply }
   * (untrusted: the coordinator service dispatched it, so sync hooks of the event ran too, and
   * published it; `reply` is its DecisionReply).
   */
  async emit(event, context, { timeoutMs = 30_000 } = {}) {
    if (this.tenant) {
      const request = this.#decisionRequest(event, context, timeoutMs);
      const { entry, reply } = await this.#ask(request, sessionOf(event, context), timeoutMs + 1_000);
      return { id: request.id, entry, reply: await reply };
    }
    const session = sessionOf(event, context);
    const message = { ...this.#envelope(), event, session_id: session, context, source: this.source };
    const entry = await this.redis.xAdd(this.keys.events(session), '*', { data: JSON.stringify(message) },
      { TRIM: { strategy: 'MAXLEN', strategyModifier: '~', threshold: EVENTS_CAP } });
    return { id: message.id, entry };
  }

  /**
   * Ask the coordinator service for a decision; resolves to the DecisionReply (status "ok" or
   * "error"). The context is sent as given: the service validates it (section 8.1).
   * Rejects when no reply arrives within timeoutMs + marginMs.
   */
  async decide(event, context, { timeoutMs = 30_000, marginMs = 1_000 } = {}) {
    const request = this.#decisionRequest(event, context, timeoutMs);
    const { reply } = await this.#ask(request, sessionOf(event, context), timeoutMs + marginMs);
    return reply;
  }

  /**
   * Cancel one of this agent's own sessions (section 6.6): every later PreToolUse of it is
   * blocked (by the CancellationHook) until the cancellation's TTL ends; nothing an agent sends
   * lifts it. Resolves to the DecisionReply, whose `result.cancelled` names the session as the
   * bus knows it (`TENANT/SESSION` for a tenant's).
   */
  async cancel(sessionId, { timeoutMs = 10_000 } = {}) {
    const request = {
      ...this.#envelope(), op: 'cancel', session_id: String(sessionId), reply_to: this.keys.inbox,
    };
    const { reply } = await this.#ask(request, String(sessionId), timeoutMs);
    return reply;
  }

  #decisionRequest(event, context, timeoutMs) {
    return { ...this.#envelope(), event, context, reply_to: this.keys.inbox, timeout_ms: timeoutMs };
  }

  // XADD the request to the session's decisions stream; { entry, reply: Promise<DecisionReply> }.
  async #ask(request, session, waitMs) {
    const reply = new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(request.id);
        const what = request.op ?? request.event;
        reject(new Error(`no DecisionReply for ${what} request ${request.id} within ${waitMs} ms`));
      }, waitMs);
      this.waiting.set(request.id, { resolve, reject, timer });
    });
    let entry;
    try {
      entry = await this.redis.xAdd(this.keys.decisions(session), '*', { data: JSON.stringify(request) },
        { TRIM: { strategy: 'MAXLEN', strategyModifier: '~', threshold: DECISIONS_CAP } });
    } catch (e) {
      clearTimeout(this.waiting.get(request.id)?.timer);
      this.waiting.delete(request.id);
      throw e;
    }
    this.popping ??= this.#popLoop();
    return { entry, reply };
  }

  // Pop replies while someone waits; hand each to the request it answers, drop the others
  // (late replies to requests we gave up on may sit in the inbox for up to 60 s).
  async #popLoop() {
    try {
      while (this.waiting.size > 0) {
        const got = await this.blocking.blPop(this.keys.inbox, POP_SECONDS);
        if (!got) continue;
        let reply;
        try { reply = JSON.parse(got.element); } catch { continue; }
        const waiter = this.waiting.get(reply?.request_id);
        if (!waiter) continue;
        this.waiting.delete(reply.request_id);
        clearTimeout(waiter.timer);
        waiter.resolve(reply);
      }
    } catch (e) { // the connection failed: fail every waiting request now
      for (const [id, waiter] of this.waiting) {
        clearTimeout(waiter.timer);
        this.waiting.delete(id);
        waiter.reject(e);
      }
    } finally {
      this.popping = null;
    }
  }

  async close() {
    for (const { timer } of this.waiting.values()) clearTimeout(timer);
    this.waiting.clear();
    await this.popping;
    await Promise.all([this.redis.close(), this.blocking.close()]);
  }
}
