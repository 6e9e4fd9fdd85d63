// A small HookBus client for Node.js, written from docs/protocol.md (wire protocol v2).
//
// It plays the "agent using the coordinator service" role (protocol.md, section 10):
//   emit(event, context)    XADD {p}:events:{e0.0}     an EventMessage (section 3.1, 6.1)
//   decide(event, context)  XADD {p}:decisions:{d0.0}  a DecisionRequest (3.5, 6.3), then BLPOP
//                           {p}:inbox:{client id} until the DecisionReply (3.6) with our id.
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { createClient } from 'redis';

export const PROTOCOL_VERSION = 2;

// The 12 lifecycle events (section 4.1).
export const EVENTS = Object.freeze([
  'OnSessionStart', 'PreToolUse', 'PostToolUse', 'PostToolUseFailure', 'OnStepComplete',
  'OnSessionStop', 'OnSubagentStart', 'OnSubagentStop', 'OnPreCompact', 'OnPostCompact',
  'PermissionRequest', 'PermissionDenied',
]);

const NAME = /^[A-Za-z0-9_.-]{1,128}$/; // prefix rule (section 1.6)
const EVENTS_CAP = 1_000_000; // backstop MAXLEN ~ for {p}:events (6.1, 6.8)
const DECISIONS_CAP = 100_000; // nothing else trims {p}:decisions (8.5)
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

export class HookBus {
  /** Connect to Redis: `await HookBus.connect('redis://127.0.0.1:6379/0', { prefix: 'hookbus' })`. */
  static async connect(url, { prefix = 'hookbus', source = 'node-agent', clientId } = {}) {
    const bus = new HookBus(url, { prefix, source, clientId });
    await Promise.all([bus.redis.connect(), bus.blocking.connect()]);
    return bus;
  }

  constructor(url, { prefix = 'hookbus', source = 'node-agent', clientId } = {}) {
    if (!NAME.test(prefix)) throw new Error(`invalid key prefix ${JSON.stringify(prefix)}`);
    this.prefix = prefix;
    this.source = source;
    this.clientId = clientId ?? `node-${hostname()}-${process.pid}-${newId().slice(0, 6)}`;
    this.keys = {
      // One partition (HOOKBUS_PARTITIONS=1, the default): its hash tags (section 2).
      events: `${prefix}:events:{e0.0}`,
      decisions: `${prefix}:decisions:{d0.0}`,
      inbox: `${prefix}:inbox:${this.clientId}`,
    };
    // One connection for commands, one for the blocking pops (section 6.3, client rules).
    // Give up after ~5 s without a server instead of retrying forever.
    const reconnectStrategy = (retries, cause) => (retries >= 10 ? cause : Math.min(100 * (retries + 1), 1000));
    this.redis = createClient({ url, socket: { connectTimeout: 5000, reconnectStrategy } });
    this.blocking = this.redis.duplicate();
    for (const c of [this.redis, this.blocking]) c.on('error', (e) => { this.lastError = e; });
    this.waiting = new Map(); // request id -> { resolve, reject, timer }
    this.popping = null;
  }

  #envelope() {
    return { v: PROTOCOL_VERSION, id: newId(), ts: Date.now(), traceparent: '', tracestate: '' };
  }

  /** Publish one EventMessage to {p}:events; returns { id, entry }. Async hooks see it. */
  async emit(event, context) {
    const message = {
      ...this.#envelope(), event, session_id: sessionOf(event, context), context,
      source: this.source,
    };
    const entry = await this.redis.xAdd(this.keys.events, '*', { data: JSON.stringify(message) },
      { TRIM: { strategy: 'MAXLEN', strategyModifier: '~', threshold: EVENTS_CAP } });
    return { id: message.id, entry };
  }

  /**
   * Ask the coordinator service for a decision; resolves to the DecisionReply (status "ok" or
   * "error"). The context is sent as given: the service validates it (section 8.1).
   * Rejects when no reply arrives within timeoutMs + marginMs.
   */
  async decide(event, context, { timeoutMs = 30_000, marginMs = 1_000 } = {}) {
    const request = {
      ...this.#envelope(), event, context, reply_to: this.keys.inbox, timeout_ms: timeoutMs,
    };
    const reply = new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(request.id);
        reject(new Error(`no DecisionReply for ${event} request ${request.id} within ${timeoutMs + marginMs} ms`));
      }, timeoutMs + marginMs);
      this.waiting.set(request.id, { resolve, reject, timer });
    });
    try {
      await this.redis.xAdd(this.keys.decisions, '*', { data: JSON.stringify(request) },
        { TRIM: { strategy: 'MAXLEN', strategyModifier: '~', threshold: DECISIONS_CAP } });
    } catch (e) {
      clearTimeout(this.waiting.get(request.id)?.timer);
      this.waiting.delete(request.id);
      throw e;
    }
    this.popping ??= this.#popLoop();
    return reply;
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
