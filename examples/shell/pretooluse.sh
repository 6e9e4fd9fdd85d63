#!/usr/bin/env bash
# One PreToolUse decision from the HookBus coordinator service, with redis-cli alone
# (docs/protocol.md, section 6.3). Prints the DecisionReply JSON on stdout.
#
#   examples/shell/pretooluse.sh [TOOL_NAME [TOOL_ARGS_JSON]]
#
# Environment:
#   REDIS_URL               redis://[user:password@]host:port/db (used with redis-cli -u);
#                           redis+cluster://… for a Redis Cluster (redis-cli -c); else
#   REDIS_HOST, REDIS_PORT  default 127.0.0.1 and 6379
#   PREFIX                  key prefix, default hookbus
#   TENANT                  an untrusted agent's tenant: the request goes to the tenant's own
#                           stream {p}:t:{TENANT}:decisions and the reply to its inbox
#                           {p}:t:{TENANT}:inbox:ID (all its credential may touch). Unset: a
#                           trusted agent on {p}:decisions:{d0.0}, the one partition of a bus
#                           with HOOKBUS_PARTITIONS=1 (the default)
#   SESSION_ID              default sh-<pid>
#   TIMEOUT_MS              decision timeout, default 5000
# TOOL_NAME (default file_read) and TOOL_ARGS_JSON (default {"path":"app/.env"}) are put in the
# JSON as given: TOOL_NAME must not contain quotes or backslashes, TOOL_ARGS_JSON must be a JSON
# object.
#
# Exit status: 0 a reply with status "ok", 1 a reply with status "error",
#              2 no reply within TIMEOUT_MS + 1 s, 3 redis-cli failed, 4 a bad TENANT,
#              5 a trusted agent on a bus of more than one partition.
set -euo pipefail

tool_name=${1:-file_read}
tool_args=${2:-'{"path":"app/.env"}'}
prefix=${PREFIX:-hookbus}
session=${SESSION_ID:-sh-$$}
timeout_ms=${TIMEOUT_MS:-5000}

if [[ "${REDIS_URL:-}" =~ ^(rediss?)\+cluster:// ]]; then
  # -c follows a cluster's MOVED redirections (each command names one key: section 9).
  cli=(redis-cli --no-auth-warning -c -u "${BASH_REMATCH[1]}://${REDIS_URL#*://}")
elif [[ -n "${REDIS_URL:-}" ]]; then
  cli=(redis-cli --no-auth-warning -u "$REDIS_URL")
else
  cli=(redis-cli -h "${REDIS_HOST:-127.0.0.1}" -p "${REDIS_PORT:-6379}")
fi

id=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')        # 32 lowercase hex characters
if [[ -n "${TENANT:-}" ]]; then
  if [[ ! "$TENANT" =~ ^[A-Za-z0-9_-]{1,64}$ ]]; then
    echo "TENANT must be 1-64 characters of letters, digits, '_' or '-'" >&2
    exit 4
  fi
  stream="$prefix:t:{$TENANT}:decisions"                 # the tenant's own stream
  inbox="$prefix:t:{$TENANT}:inbox:sh-$(hostname)-$$-${id:0:6}"
else
  stream="$prefix:decisions:{d0.0}"                      # partition 0 of 1
  inbox="$prefix:inbox:sh-$(hostname)-$$-${id:0:6}"      # our own reply list
  # The bus's partition count (section 2, {p}:config): this script knows only one partition.
  partitions=$("${cli[@]}" HGET "$prefix:config" partitions) || exit 3
  if [[ -n "$partitions" && "$partitions" != 1 ]]; then
    echo "this script sends to 1 partition but the bus (prefix $prefix) has $partitions ($prefix:config partitions): use TENANT, or a client that computes the partitions (examples/node)" >&2
    exit 5
  fi
fi
now=$(date +%s%3N)                                       # epoch milliseconds

request="{\"v\":3,\"id\":\"$id\",\"ts\":$now,\"traceparent\":\"\",\"tracestate\":\"\",\
\"event\":\"PreToolUse\",\"context\":{\"session_id\":\"$session\",\"tool_name\":\"$tool_name\",\
\"tool_args\":$tool_args,\"step\":0},\"reply_to\":\"$inbox\",\"timeout_ms\":$timeout_ms}"

"${cli[@]}" XADD "$stream" MAXLEN '~' 100000 '*' data "$request" >/dev/null || exit 3

# Wait a little longer than timeout_ms: the service's timeout error reply comes at ts + timeout_ms.
wait_secs=$(( (timeout_ms + 1000 + 999) / 1000 ))
deadline=$(( $(date +%s) + wait_secs ))
while :; do
  left=$(( deadline - $(date +%s) ))
  if (( left <= 0 )); then
    echo "no DecisionReply on $inbox within ${wait_secs}s" >&2
    exit 2
  fi
  # --raw BLPOP prints the key, then the element; nothing (an empty line) on timeout.
  out=$("${cli[@]}" --raw BLPOP "$inbox" "$left") || exit 3
  reply=$(printf '%s\n' "$out" | sed -n 2p)
  [[ -z "$reply" ]] && continue
  # The inbox is ours alone, but check the correlation id anyway (replies are compact JSON).
  [[ "$reply" == *"\"request_id\":\"$id\""* ]] || continue
  printf '%s\n' "$reply"
  [[ "$reply" == *'"status":"ok"'* ]] && exit 0
  exit 1
done
