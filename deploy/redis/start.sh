#!/bin/sh
# Start redis-server with the HookBus ACL users of deploy/redis/users.acl.
#
# users.acl holds each role's rules and no secret: this script drops its comments, appends each
# user's password and starts `redis-server --aclfile RENDERED "$@"`. A user's password is the
# file $HOOKBUS_SECRETS_DIR/hookbus_<user>_password (Docker/Compose secrets) if it exists, else
# the variable HOOKBUS_<USER>_PASSWORD; a user without either stops the start. Passwords go into
# redis:// URLs, so keep them URL-safe (e.g. `openssl rand -hex 24`).
#
#   HOOKBUS_ACL_TEMPLATE  the rules (default: users.acl beside this script)
#   HOOKBUS_ACL_FILE      where the rendered file goes, readable by redis only (/tmp/...)
#   HOOKBUS_SECRETS_DIR   where secret files are looked for (/run/secrets)
#
# In the redis image it hands over to the image's own entrypoint (which drops root); elsewhere
# (tests/test_deploy.py runs it against a local redis-server) it execs redis-server itself.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
template=${HOOKBUS_ACL_TEMPLATE:-$here/users.acl}
rendered=${HOOKBUS_ACL_FILE:-/tmp/hookbus-users.acl}
secrets=${HOOKBUS_SECRETS_DIR:-/run/secrets}

# `+client|setinfo` exists from Redis 7.2; an older server refuses the whole file for it.
version=$(redis-server --version | sed -n 's/.* v=\([0-9]*\)\.\([0-9]*\)\..*/\1 \2/p')
old_server=no
major=${version% *}
minor=${version#* }
if [ "${major:-0}" -lt 7 ] || { [ "$major" -eq 7 ] && [ "${minor:-0}" -lt 2 ]; }; then
  old_server=yes
fi

umask 077
: > "$rendered"
while IFS= read -r line || [ -n "$line" ]; do
  case $line in
    '' | '#'*) continue ;;
  esac
  if [ "$old_server" = yes ]; then
    line=$(printf '%s\n' "$line" | sed 's/ +client|setinfo//g')
  fi
  user=$(printf '%s\n' "$line" | awk '{print $2}')
  if [ "$user" = default ]; then
    printf '%s\n' "$line" >> "$rendered"
    continue
  fi
  file=$secrets/hookbus_${user}_password
  var=HOOKBUS_$(printf '%s' "$user" | tr '[:lower:]' '[:upper:]')_PASSWORD
  if [ -f "$file" ]; then
    password=$(cat "$file")
  else
    eval "password=\${$var:-}"
  fi
  case $password in
    '') echo "start.sh: no password for Redis user $user: set $var or $file" >&2; exit 1 ;;
    *[[:space:]]*) echo "start.sh: the password of Redis user $user contains white space" >&2; exit 1 ;;
  esac
  printf '%s >%s\n' "$line" "$password" >> "$rendered"
done < "$template"

if [ "$(id -u)" = 0 ] && id redis > /dev/null 2>&1; then
  chown redis "$rendered"
fi

if command -v docker-entrypoint.sh > /dev/null 2>&1; then
  exec docker-entrypoint.sh redis-server --aclfile "$rendered" "$@"
fi
exec redis-server --aclfile "$rendered" "$@"
