#!/bin/bash
# etcd backup and restore under a running Tributary daemon, and a rolling restart of the members (the
# upgrade procedure with the same etcd version: only 3.4.23 is installed). Run for real on loopback.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${TRIBUTARY:-$ROOT/target/debug/tributary}
D=$(mktemp -d); trap 'rm -rf $D' EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
declare -A CP PP; for i in 1 2 3; do CP[$i]=$(port); PP[$i]=$(port); done
IC="m1=http://127.0.0.1:${PP[1]},m2=http://127.0.0.1:${PP[2]},m3=http://127.0.0.1:${PP[3]}"
EPS="http://127.0.0.1:${CP[1]},http://127.0.0.1:${CP[2]},http://127.0.0.1:${CP[3]}"
start_member() { # i datadir [state]
  etcd --name m$1 --data-dir $2 --listen-client-urls http://127.0.0.1:${CP[$1]} --advertise-client-urls http://127.0.0.1:${CP[$1]} \
    --listen-peer-urls http://127.0.0.1:${PP[$1]} --initial-advertise-peer-urls http://127.0.0.1:${PP[$1]} \
    --initial-cluster $IC --initial-cluster-state ${3:-new} --initial-cluster-token tributary-etcd >> $D/etcd-m$1.log 2>&1 &
  echo $! > $D/etcd-pid-$1
}
for i in 1 2 3; do start_member $i $D/m$i; done
sleep 3
export ETCDCTL_API=3
head -c 32 /dev/urandom > $D/secrets.key && chmod 600 $D/secrets.key
PA=$(port); mkdir -p $D/conf $D/data
$B serve --listen 127.0.0.1:$PA --data-dir $D/data --conf-dir $D/conf --plugins-dir $ROOT/plugins \
  --test-cmd true --reload-cmd true --no-reload-confirm --store etcd --etcd-endpoints $EPS \
  --secrets-key $D/secrets.key --host-id host-a --etcd-lease-ttl-secs 2 > $D/log-a 2>&1 &
DPID=$!
sleep 2
add() { $B binding add $1 --plugin static --provider static --service web --config targets=127.0.0.1:$2 --interval 10 --api http://127.0.0.1:$PA --data-dir $D/data >/dev/null && echo "added $1"; }
add before 8081
set -x
etcdctl --endpoints=$EPS endpoint status --write-out=table
etcdctl --endpoints=http://127.0.0.1:${CP[1]} snapshot save $D/snapshot.db
etcdctl snapshot status $D/snapshot.db --write-out=table
set +x
add after 8082
ls $D/conf/upstreams
echo "== every member stopped; each restored from the snapshot into a new data dir"
for i in 1 2 3; do kill $(cat $D/etcd-pid-$i); done; sleep 1
set -x
for i in 1 2 3; do
  etcdctl snapshot restore $D/snapshot.db --name m$i --data-dir $D/m$i-restored \
    --initial-cluster $IC --initial-cluster-token tributary-etcd-restored \
    --initial-advertise-peer-urls http://127.0.0.1:${PP[$i]}
done
set +x
for i in 1 2 3; do start_member $i $D/m$i-restored; done
sleep 6
etcdctl --endpoints=$EPS endpoint status --write-out=table
etcdctl --endpoints=$EPS get --prefix /tributary/bindings/ --keys-only
echo "== the daemon (never restarted):"
grep -E "etcd went back|no longer in the store|mirror synced" $D/log-a | sed 's/^.*\(INFO\|WARN\)/\1/' | cut -c1-300
ls $D/conf/upstreams
echo "== rolling restart, one member at a time (an upgrade replaces the binary between stop and start)"
for i in 1 2 3; do
  set -x
  kill $(cat $D/etcd-pid-$i); sleep 1
  start_member $i $D/m$i-restored existing; sleep 3
  etcdctl --endpoints=$EPS endpoint health
  set +x
done
add during-roll 8083
$B fleet hosts --api http://127.0.0.1:$PA --data-dir $D/data
kill $DPID; sleep 1; for i in 1 2 3; do kill $(cat $D/etcd-pid-$i); done; wait 2>/dev/null
