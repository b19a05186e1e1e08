#!/bin/sh
# Image entrypoint: refuse to start the API open to anyone by mistake.  `autopar serve`
# needs AUTOPAR_API_KEYS (comma list of accepted X-API-Key values) unless anonymous
# access is asked for explicitly with AUTOPAR_ALLOW_ANONYMOUS=1.  Other commands
# (`autopar worker`, `autopar submit`, a shell) run as given.
set -e
case "$1 $2" in
  "autopar serve"|"serve "*)
    [ "$1" = serve ] && set -- autopar "$@"
    case "${AUTOPAR_ALLOW_ANONYMOUS:-0}" in 1|true|TRUE|True|yes) anonymous=1 ;; *) anonymous=0 ;; esac
    if [ -z "$(printf '%s' "${AUTOPAR_API_KEYS:-}" | tr -d ' ,')" ] && [ "$anonymous" != 1 ]; then
      echo "autopar: error: [no_api_keys] refusing to start the API without AUTOPAR_API_KEYS; set AUTOPAR_API_KEYS=key1,key2 (clients send X-API-Key), or AUTOPAR_ALLOW_ANONYMOUS=1 to serve without keys" >&2
      exit 2
    fi
    ;;
esac
exec "$@"
