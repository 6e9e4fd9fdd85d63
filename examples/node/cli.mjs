#!/usr/bin/env node
// Command-line use of hookbus.mjs. Every result is one JSON line on stdout.
//
//   node cli.mjs [--url URL] [--prefix P] [--tenant T] [--partitions N] [--session S]
//                [--timeout-ms N] COMMAND [ARGS]
//
//   scenario            (default) emit-all, then ask for a PreToolUse and a PermissionRequest decision
//   emit-all            publish the 12 lifecycle events, each with a valid context: to the
//                       session's {p}:events partition (trusted), or as decision requests
//                       through the coordinator service (--tenant)
//   vector FILE...      ask for a decision on each conformance vector's event and context
//   decide EVENT JSON   ask for one decision; the context JSON is sent exactly as given
//   cancel [SESSION]    cancel a session of this agent's own (default: --session)
//
// Defaults: --url $HOOKBUS_REDIS_URL or redis://127.0.0.1:6379/0 (redis+cluster://HOST:PORT for
// a Redis Cluster), --prefix $HOOKBUS_PREFIX or hookbus, --tenant $HOOKBUS_TENANT (none: a
// trusted agent), --partitions $HOOKBUS_PARTITIONS or 1 (trusted agents only).
// Exit status: 0 done, 1 a request got no reply (or Redis failed), 2 bad usage.
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { EVENTS, HookBus } from './hookbus.mjs';

/** A valid context for each of the 12 events (protocol.md, section 4.3). */
export function exampleContexts(session) {
  return {
    OnSessionStart: { session_id: session, turn_index: 0, is_resume: false },
    PreToolUse: { session_id: session, tool_name: 'file_read', tool_args: { path: 'README.md' }, step: 1 },
    PostToolUse: {
      session_id: session, agent_name: 'main', tool_name: 'file_read',
      tool_args: { path: 'README.md' }, output_content: '# HookBus', is_error: false, step: 1,
      elapsed_ms: 2.5,
    },
    PostToolUseFailure: {
      session_id: session, agent_name: 'main', tool_name: 'run_shell', error_message: 'exit 1',
      is_interrupt: false, step: 2, elapsed_ms: 10, tool_args: { command: 'false' },
    },
    OnStepComplete: {
      session_id: session, step: 2, max_steps: 10, messages_count: 5, estimated_tokens: 1200,
      token_limit: 200000,
    },
    OnSessionStop: { session_id: session, terminal: 'Completed', total_steps: 2 },
    OnSubagentStart: { parent_session_id: session, subagent_name: 'researcher', prompt: 'find the docs' },
    OnSubagentStop: {
      parent_session_id: session, subagent_name: 'researcher', result_summary: 'found them',
      steps: 3, is_error: false,
    },
    OnPreCompact: { session_id: session, message_count: 40, estimated_tokens: 150000 },
    OnPostCompact: { session_id: session, new_message_count: 8, compression_method: 'summary' },
    PermissionRequest: {
      session_id: session, tool_name: 'run_shell', tool_args: { command: 'ls -la' },
      current_decision: 'Ask', permission_mode: 'default', is_subagent: false,
    },
    PermissionDenied: { session_id: session, tool_name: 'run_shell', reason: 'rm is not allowed', source: 'Rule' },
  };
}

function parseArgs(argv) {
  const opts = {
    url: process.env.HOOKBUS_REDIS_URL ?? 'redis://127.0.0.1:6379/0',
    prefix: process.env.HOOKBUS_PREFIX ?? 'hookbus',
    tenant: process.env.HOOKBUS_TENANT ?? '',
    partitions: Number.parseInt(process.env.HOOKBUS_PARTITIONS ?? '1', 10),
    session: `node-${process.pid}`,
    timeoutMs: 10_000,
    rest: [],
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === '--url') opts.url = value();
    else if (arg === '--prefix') opts.prefix = value();
    else if (arg === '--tenant') opts.tenant = value();
    else if (arg === '--partitions') opts.partitions = Number.parseInt(value(), 10);
    else if (arg === '--session') opts.session = value();
    else if (arg === '--timeout-ms') opts.timeoutMs = Number.parseInt(value(), 10);
    else if (arg === '-h' || arg === '--help') opts.help = true;
    else opts.rest.push(arg);
  }
  return opts;
}

const print = (obj) => process.stdout.write(`${JSON.stringify(obj)}\n`);

async function emitAll(bus, session) {
  const contexts = exampleContexts(session);
  for (const event of EVENTS) {
    const { id, entry, reply } = await bus.emit(event, contexts[event]);
    print({ kind: 'emitted', event, id, entry, ...(reply ? { reply } : {}) });
  }
}

async function decide(bus, event, context, timeoutMs, extra = {}) {
  const reply = await bus.decide(event, context, { timeoutMs });
  print({ kind: 'decision', ...extra, event, reply });
}

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error(e.message);
    return 2;
  }
  const [command = 'scenario', ...args] = opts.rest;
  const known = ['scenario', 'emit-all', 'vector', 'decide', 'cancel'];
  if (opts.help || !known.includes(command) || (command === 'decide' && args.length !== 2)
      || (command === 'vector' && args.length === 0) || (command === 'cancel' && args.length > 1)) {
    console.error('usage: node cli.mjs [--url URL] [--prefix P] [--tenant T] [--partitions N] '
      + '[--session S] [--timeout-ms N] '
      + '[scenario | emit-all | vector FILE... | decide EVENT CONTEXT_JSON | cancel [SESSION]]');
    return opts.help ? 0 : 2;
  }
  let bus;
  try {
    bus = new HookBus(opts.url, {
      prefix: opts.prefix, source: 'node-example', tenant: opts.tenant, partitions: opts.partitions,
    });
  } catch (e) { // a bad prefix, tenant or number of partitions
    console.error(e.message);
    return 2;
  }
  try {
    await bus.connect();
  } catch (e) { // another partition count than the bus's (section 2), or no Redis
    console.error(e.message);
    return 2;
  }
  try {
    if (command === 'scenario' || command === 'emit-all') await emitAll(bus, opts.session);
    if (command === 'scenario') {
      // Decisions use contexts of their own: the service publishes what it dispatches (6.1).
      await decide(bus, 'PreToolUse', {
        session_id: opts.session, tool_name: 'file_read', tool_args: { path: 'app/.env' }, step: 3,
      }, opts.timeoutMs);
      await decide(bus, 'PermissionRequest', {
        session_id: opts.session, tool_name: 'run_shell', tool_args: { command: 'rm -rf /tmp/x' },
        current_decision: 'Ask',
      }, opts.timeoutMs);
    }
    if (command === 'vector') {
      for (const file of args) {
        const vector = JSON.parse(readFileSync(file, 'utf8'));
        await decide(bus, vector.event, vector.context, opts.timeoutMs, { vector: basename(file, '.json') });
      }
    }
    if (command === 'decide') await decide(bus, args[0], JSON.parse(args[1]), opts.timeoutMs);
    if (command === 'cancel') {
      const session = args[0] ?? opts.session;
      print({ kind: 'cancelled', session, reply: await bus.cancel(session, { timeoutMs: opts.timeoutMs }) });
    }
  } finally {
    await bus.close();
  }
  return 0;
}

main().then((code) => { process.exitCode = code; }, (e) => {
  console.error(`error: ${e.message}`);
  process.exitCode = 1;
});
