#!/bin/bash
# Moving a host from --store sqlite to etcd without its nginx losing an upstream. Run for real.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${TRIBUTARY:-$ROOT/target/debug/tributary}
D=$(mktemp -d); trap 'rm -rf $D' EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
C=$(port); PP=$(port); P=$(port); PI=$(port)
etcd --name m1 --data-dir $D/etcd --listen-client-urls http://127.0.0.1:$C --advertise-client-urls http://127.0.0.1:$C \
  --listen-peer-urls http://127.0.0.1:$PP --initial-advertise-peer-urls http://127.0.0.1:$PP \
  --initial-cluster m1=http://127.0.0.1:$PP > $D/etcd.log 2>&1 &
EPID=$!
mkdir -p $D/conf $D/data
COMMON="--conf-dir $D/conf --plugins-dir $ROOT/plugins --test-cmd true --reload-cmd true --no-reload-confirm"
$B serve --listen 127.0.0.1:$P --data-dir $D/data $COMMON > $D/log-sqlite 2>&1 &
SPID=$!; sleep 2
export TRIBUTARY_API=http://127.0.0.1:$P TRIBUTARY_DATA_DIR=$D/data
for n in web:8081 api:8082; do
  $B binding add ${n%%:*} --plugin static --provider static --service web --config targets=127.0.0.1:${n##*:} --interval 30 >/dev/null
done
set -x
# 1. The bindings as the SQLite daemon has them (secret values are never shown: each is "secrets": {"field": true}).
tributary_list() { $B binding list --json; }
tributary_list > $D/bindings.json
jq -c '.bindings[] | {name, secrets}' $D/bindings.json
# 2. Their bulk body: every field but the secrets, which you add (here: none, the static plugin has no secret).
jq '{bindings: [.bindings[] | {name, plugin, provider, service, interval_secs, directives, config, probe, drain_secs}]}' $D/bindings.json > $D/bulk.json
# 3. A one-off importer daemon on etcd, with a scratch conf dir (it must not touch nginx), saves them.
head -c 32 /dev/urandom > $D/secrets.key && chmod 600 $D/secrets.key
mkdir -p $D/scratch-conf $D/importer-data
$B serve --listen 127.0.0.1:$PI --data-dir $D/importer-data --conf-dir $D/scratch-conf --plugins-dir $ROOT/plugins \
  --test-cmd true --reload-cmd true --no-reload-confirm --store etcd --etcd-endpoints http://127.0.0.1:$C \
  --secrets-key $D/secrets.key --host-id importer > $D/log-importer 2>&1 &
IPID=$!; sleep 2
curl -sS -X POST -H "Authorization: Bearer $(cat $D/importer-data/token)" -H 'Content-Type: application/json' \
  --data @$D/bulk.json http://127.0.0.1:$PI/api/v1/bindings/bulk
echo
kill $IPID; sleep 1
# 4. The host itself: stop the SQLite daemon, start it on etcd (same data and conf dirs; the SQLite file stays as it was).
cp $D/conf/upstreams/web.conf $D/web.conf.before
kill $SPID; sleep 1
$B serve --listen 127.0.0.1:$P --data-dir $D/data $COMMON --store etcd --etcd-endpoints http://127.0.0.1:$C \
  --secrets-key $D/secrets.key --host-id host-a > $D/log-etcd 2>&1 &
EPID2=$!; sleep 4
$B binding list
cmp $D/conf/upstreams/web.conf $D/web.conf.before && echo "web.conf unchanged"
# 5. The importer is gone: forget it.
$B fleet forget-host importer
$B fleet hosts
set +x
grep -c "no longer in the store" $D/log-etcd
kill $EPID2; sleep 1; kill $EPID; wait 2>/dev/null
