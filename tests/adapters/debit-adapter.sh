#!/bin/sh
# A bank's own debit adapter, plugged into charge-worker through
# CHARGE_DEBIT_CMD: same envelope in and out, same exit codes.  This one
# "debits" by appending to a file and answers with its own reference.
# charge-worker asks every step whether its configuration holds first.
[ "${1:-}" = --check ] && exit 0
line=$(cat)
case $line in
*'"claim":{"outcome":"ACQUIRED"'*) ;;
*) printf '%s\n' "$line"; exit 11 ;;
esac
id=$(printf '%s' "$line" | sed 's/.*"claim":{"outcome":"ACQUIRED","chargeId":"\([^"]*\)".*/\1/')
echo "$id" >> "${ADAPTER_LEDGER:?}"
printf '%s,"debit":{"outcome":"OK","ref":"ADAPTER-%s"}}\n' "${line%\}}" "$id"
