#!/bin/bash
# Per-host etcd permissions for a Tributary fleet: run for real (single-member etcd on loopback, auth on,
# two daemons with the static plugin). Prints what it checks.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${TRIBUTARY:-$ROOT/target/debug/tributary}
D=$(mktemp -d); trap 'rm -rf $D' EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
C=$(port); PP=$(port); PA=$(port); PB=$(port)
etcd --name m1 --data-dir $D/etcd --listen-client-urls http://127.0.0.1:$C --advertise-client-urls http://127.0.0.1:$C \
  --listen-peer-urls http://127.0.0.1:$PP --initial-advertise-peer-urls http://127.0.0.1:$PP \
  --initial-cluster m1=http://127.0.0.1:$PP > $D/etcd.log 2>&1 &
EPID=$!
sleep 2
export ETCDCTL_API=3 ETCDCTL_ENDPOINTS=http://127.0.0.1:$C
set -x
etcdctl user add root --new-user-password=rootpw
etcdctl auth enable
R="etcdctl --user root:rootpw"
# Every host: reads the whole prefix; writes its own heartbeat, writes' markers, outcomes and unable
# markers (each prefix ends with /: host-b's must not hold host-b2's keys); writes the fleet-wide
# keys no layout can scope (claims, sets).
for h in host-a host-b; do
  $R role add tributary-$h
  $R role grant-permission --prefix=true tributary-$h read /tributary/
  $R role grant-permission tributary-$h readwrite /tributary/hosts/$h
  $R role grant-permission --prefix=true tributary-$h readwrite /tributary/writes/$h/
  for k in resolvers targets; do
    $R role grant-permission --prefix=true tributary-$h readwrite /tributary/$k/
  done
  for k in outcomes-by-host unable-by-host; do
    $R role grant-permission --prefix=true tributary-$h readwrite /tributary/$k/$h/
  done
  $R user add $h --new-user-password=pw-$h
  $R user grant-role $h tributary-$h
done
# Hosts through which people save bindings: the bindings and their name claims.
$R role add tributary-editor
$R role grant-permission --prefix=true tributary-editor readwrite /tributary/bindings/
$R role grant-permission --prefix=true tributary-editor readwrite /tributary/names/
$R user grant-role host-a tributary-editor
$R role get tributary-host-b
set +x
printf 'pw-host-a\n' > $D/pw-a; printf 'pw-host-b\n' > $D/pw-b; chmod 600 $D/pw-a $D/pw-b
head -c 32 /dev/urandom > $D/secrets.key && chmod 600 $D/secrets.key
for h in a b; do
  mkdir -p $D/conf-$h $D/data-$h
  P=$PA; [ $h = b ] && P=$PB
  $B serve --listen 127.0.0.1:$P --data-dir $D/data-$h --conf-dir $D/conf-$h --plugins-dir $ROOT/plugins \
    --test-cmd true --reload-cmd true --no-reload-confirm --store etcd --etcd-endpoints http://127.0.0.1:$C \
    --secrets-key $D/secrets.key --host-id host-$h --etcd-user host-$h --etcd-password-file $D/pw-$h \
    --etcd-lease-ttl-secs 2 > $D/log-$h 2>&1 &
  echo $! > $D/pid-$h
done
sleep 3
echo "== binding saved through host-a (editor)"
$B binding add api --plugin static --provider static --service web --config targets=127.0.0.1:8081 --interval 10 \
  --api http://127.0.0.1:$PA --data-dir $D/data-a && echo saved
sleep 3
echo "== host-b's file:"; cat $D/conf-b/upstreams/api.conf
echo "== fleet view on host-b:"; $B fleet hosts --api http://127.0.0.1:$PB --data-dir $D/data-b
echo "== saving through host-b (no editor role):"
$B binding add other --plugin static --provider static --service web --config targets=127.0.0.1:8082 --interval 10 \
  --api http://127.0.0.1:$PB --data-dir $D/data-b --no-wait; echo "exit $?"
echo "== the outcomes in etcd (host first):"; $R get --prefix --keys-only /tributary/outcomes-by-host/
echo "== host-b's etcd user writing host-a's heartbeat, a binding, markers and outcome of host-a:"
etcdctl --user host-b:pw-host-b put /tributary/hosts/host-a forged; echo "exit $?"
etcdctl --user host-b:pw-host-b put /tributary/bindings/evil forged; echo "exit $?"
etcdctl --user host-b:pw-host-b put /tributary/writes/host-a/x forged; echo "exit $?"
etcdctl --user host-b:pw-host-b put /tributary/unable-by-host/host-a/api forged; echo "exit $?"
etcdctl --user host-b:pw-host-b put /tributary/outcomes-by-host/host-a/api '{}' ; echo "exit $?"
echo "== what host-b's user can still write (not host-scoped: any binding's target set):"
etcdctl --user host-b:pw-host-b put /tributary/targets/zz-scratch '{}' ; echo "exit $?"
$R del /tributary/targets/zz-scratch
echo "== permission errors in the daemons' logs:"; grep -ci "permission denied" $D/log-a $D/log-b
echo "== host-b stops; forgotten through host-a (host and editor roles only):"
kill $(cat $D/pid-b); sleep 2
$B fleet forget-host host-b --api http://127.0.0.1:$PA --data-dir $D/data-a; echo "exit $?"
set -x
$R role add tributary-operator
for k in outcomes-by-host unable-by-host outcomes-gone writes; do
  $R role grant-permission --prefix=true tributary-operator readwrite /tributary/$k/
done
$R user grant-role host-a tributary-operator
set +x
$B fleet forget-host host-b --api http://127.0.0.1:$PA --data-dir $D/data-a; echo "exit $?"
echo "== a compromised host-b: its etcd user loses its roles, then goes"
set -x
$R user revoke-role host-b tributary-host-b
$R user delete host-b
set +x
etcdctl --user host-b:pw-host-b get /tributary/bindings/api; echo "exit $?"
echo "== which key seals each binding:"
$R get --prefix /tributary/bindings/ --print-value-only | grep -o '"config":"v1:[0-9a-f]*:' | sort | uniq -c
kill $(cat $D/pid-a); sleep 2; kill $EPID; wait 2>/dev/null
