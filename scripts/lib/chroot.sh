# shellcheck shell=bash
# Debian chroots for the script test suites (fresh-machine set-up, nginx versions, packaging).
# Source it: `. scripts/lib/chroot.sh`. Needs root (debootstrap, mount namespaces).
#
#   chroot_base SUITE [VARIANT]      print the path of a cached `debootstrap --variant=VARIANT` (default minbase)
#                                    chroot of Debian SUITE (bookworm, trixie, sid), made once per machine
#   chroot_copy SUITE VARIANT DEST   a fresh copy of that cached base in DEST (for tests that must start clean)
#   chroot_exec ROOT [--bind SRC[:DST]]... [--ro-bind SRC[:DST]]... [--env NAME=VALUE]... -- CMD...
#                                    run CMD inside ROOT in a private mount namespace: every mount (/proc, a
#                                    private /dev, /sys, the binds) vanishes when it exits, also when killed
#   chroot_exec_into ROOT ... -- CMD...  chroot_exec replacing the calling shell (CMD keeps its PID)
#   chroot_with_packages SUITE VARIANT PKG...
#                                    print the path of a cached chroot: the base plus PKG... installed by apt
#   chroot_apt_update_opts SUITE     print the option `apt-get update` needs in a SUITE chroot (sid: no Valid-Until check)
#   chroot_apt_archives SUITE        print the machine-wide folder of SUITE's downloaded .debs; bind it onto
#                                    /var/cache/apt/archives so repeated runs download nothing
#
# Machine-wide cache: ${TRIBUTARY_CHROOT_CACHE:-/var/cache/tributary/chroots}
#   <suite>-<variant>/root      the base chroot; <suite>-<variant>/complete marks it finished (a chroot
#                               without the marker, e.g. from a killed run, is removed and made again)
#   <suite>-<variant>.lock      flock serialising the making of the base across processes
#   archives/<suite>/           .deb files (debootstrap's --cache-dir and apt's archive cache)
# Mirror: ${TRIBUTARY_DEBIAN_MIRROR:-http://deb.debian.org/debian} (security updates from
# ${TRIBUTARY_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}). A base older than
# ${TRIBUTARY_CHROOT_MAX_AGE_DAYS:-30} days is made again (its packages would lag the archive).

chroot_cache_dir() {
  printf '%s\n' "${TRIBUTARY_CHROOT_CACHE:-/var/cache/tributary/chroots}"
}

_chroot_die() {
  echo "chroot.sh: $*" >&2
  return 1
}

_chroot_check_suite() {
  case "$1" in
    bookworm | trixie | sid) ;;
    *) _chroot_die "unknown Debian suite '$1' (expected bookworm, trixie or sid)" ;;
  esac
}

_chroot_check_variant() {
  case "$1" in
    minbase | buildd | -) ;;
    *) _chroot_die "unknown debootstrap variant '$1' (expected minbase, buildd or - for debootstrap's default)" ;;
  esac
}

chroot_apt_archives() {
  _chroot_check_suite "$1" || return 1
  local dir
  dir="$(chroot_cache_dir)/archives/$1"
  mkdir -p "$dir/partial" || return 1
  printf '%s\n' "$dir"
}

# Removes DIR (a chroot) without crossing into anything still mounted below it.
_chroot_remove() {
  local dir=$1 mounts
  [ -e "$dir" ] || return 0
  mounts=$(findmnt -rn -o TARGET | awk -v d="$dir" 'index($0, d "/") == 1 || $0 == d')
  if [ -n "$mounts" ]; then
    _chroot_die "cannot remove $dir: still mounted below it: $(echo "$mounts" | tr '\n' ' ')"
    return 1
  fi
  rm -rf --one-file-system "$dir"
}

_chroot_need_debootstrap() {
  command -v debootstrap >/dev/null && return 0
  echo "chroot.sh: installing debootstrap" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null \
    || _chroot_die "could not install debootstrap; install it with: apt-get install debootstrap"
}

# Writes the apt sources a fresh installation of SUITE has (the suite, its updates and its security
# updates; sid has neither).
_chroot_write_sources() {
  local root=$1 suite=$2
  local mirror=${TRIBUTARY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  local security=${TRIBUTARY_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
  {
    echo "deb $mirror $suite main"
    if [ "$suite" != sid ]; then
      echo "deb $mirror $suite-updates main"
      echo "deb $security $suite-security main"
    fi
  } >"$root/etc/apt/sources.list"
}

chroot_base() {
  local suite=${1:?chroot_base SUITE [VARIANT]} variant=${2:-minbase}
  _chroot_check_suite "$suite" || return 1
  _chroot_check_variant "$variant" || return 1
  [ "$(id -u)" -eq 0 ] || { _chroot_die "chroot_base needs root (debootstrap)"; return 1; }
  local cache dir
  cache=$(chroot_cache_dir)
  dir="$cache/$suite-$variant"
  mkdir -p "$cache" || return 1
  (
    exec 9>"$dir.lock"
    flock 9
    max_age=${TRIBUTARY_CHROOT_MAX_AGE_DAYS:-30}
    if [ -f "$dir/complete" ] && [ -d "$dir/root" ] \
       && [ -z "$(find "$dir/complete" -mtime "+$max_age" 2>/dev/null)" ]; then
      exit 0
    fi
    if [ -e "$dir" ]; then
      echo "chroot.sh: removing the unfinished or outdated chroot $dir" >&2
      _chroot_remove "$dir" || exit 1
    fi
    _chroot_need_debootstrap || exit 1
    archives=$(chroot_apt_archives "$suite") || exit 1
    mkdir -p "$dir"
    echo "chroot.sh: debootstrap --variant=$variant $suite into $dir/root (once per machine)" >&2
    variant_arg=()
    [ "$variant" != - ] && variant_arg=(--variant="$variant")
    # In a private mount namespace: the /proc and /sys debootstrap mounts in the target vanish with it,
    # also when it is killed.
    if ! unshare -m --propagation private -- debootstrap "${variant_arg[@]}" --cache-dir="$archives" \
         "$suite" "$dir/root" "${TRIBUTARY_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$dir/debootstrap.log" 2>&1; then
      _chroot_die "debootstrap of $suite failed; see $dir/debootstrap.log (last lines below)"
      tail -n 15 "$dir/debootstrap.log" >&2
      exit 1
    fi
    _chroot_write_sources "$dir/root" "$suite"
    # A real installation keeps downloaded packages for apt's cache; make sure no "clean after
    # install" hook from the host's image is inherited (debootstrap copies none, this is a guard).
    rm -f "$dir/root/etc/apt/apt.conf.d/docker-clean"
    rm -f "$dir/root/var/cache/apt/archives/"*.deb
    date -u +%FT%TZ >"$dir/complete"
  ) || return 1
  printf '%s\n' "$dir/root"
}

chroot_copy() {
  local suite=${1:?chroot_copy SUITE VARIANT DEST} variant=${2:?chroot_copy SUITE VARIANT DEST}
  local dest=${3:?chroot_copy SUITE VARIANT DEST} base
  base=$(chroot_base "$suite" "$variant") || return 1
  if [ -e "$dest" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
    _chroot_die "chroot_copy: $dest exists and is not empty"
    return 1
  fi
  mkdir -p "$dest" || return 1
  cp -a --reflink=auto "$base/." "$dest/" || { _chroot_die "chroot_copy: copying $base to $dest failed"; return 1; }
}

# chroot_exec ROOT [--bind SRC[:DST]]... [--ro-bind SRC[:DST]]... [--env NAME=VALUE]... -- CMD...
# CMD runs as root with a clean environment (PATH, HOME=/root, LANG=C.UTF-8, TERM, DEBIAN_FRONTEND
# and the --env pairs). /etc/resolv.conf is the host's (read-only), so apt reaches the mirror.
chroot_exec() {
  local root=${1:?chroot_exec ROOT [--bind SRC[:DST]]... [--ro-bind SRC[:DST]]... -- CMD...}
  shift
  [ -d "$root" ] || { _chroot_die "chroot_exec: $root is not a directory"; return 1; }
  [ "$(id -u)" -eq 0 ] || { _chroot_die "chroot_exec needs root (mount namespaces)"; return 1; }
  unshare -m --propagation private -- bash "${BASH_SOURCE[0]}" __chroot_exec_inner "$root" "$@"
}

# Runs in the new mount namespace: everything mounted here is private to it.
_chroot_exec_inner() {
  set -euo pipefail
  local root
  root=$(realpath "$1")
  shift
  local binds=() envs=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --bind | --ro-bind)
        [ $# -ge 2 ] || _chroot_die "chroot_exec: $1 needs SRC[:DST]"
        binds+=("$1" "$2")
        shift 2
        ;;
      --env)
        [ $# -ge 2 ] || _chroot_die "chroot_exec: --env needs NAME=VALUE"
        envs+=("$2")
        shift 2
        ;;
      --)
        shift
        break
        ;;
      *) _chroot_die "chroot_exec: unknown option '$1' (options end with --)" ;;
    esac
  done
  [ $# -gt 0 ] || _chroot_die "chroot_exec: no command after --"

  # The root itself becomes a mount point so that nothing below can escape by `..` tricks of binds.
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mkdir -p "$root/sys"
  mount --rbind -o ro /sys "$root/sys" 2>/dev/null || mount --rbind /sys "$root/sys"
  # A private /dev: the usual device nodes bound from the host, fresh pts and shm.
  mount -t tmpfs -o mode=0755,nosuid dev "$root/dev"
  local n
  for n in null zero full random urandom tty; do
    touch "$root/dev/$n"
    mount --bind "/dev/$n" "$root/dev/$n"
  done
  mkdir -p "$root/dev/pts" "$root/dev/shm"
  mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
  ln -s pts/ptmx "$root/dev/ptmx"
  mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm"
  ln -s /proc/self/fd "$root/dev/fd"
  ln -s /proc/self/fd/0 "$root/dev/stdin"
  ln -s /proc/self/fd/1 "$root/dev/stdout"
  ln -s /proc/self/fd/2 "$root/dev/stderr"
  # Name resolution for apt, npm and pip: the host's resolver (same network namespace).
  if [ -L "$root/etc/resolv.conf" ] || [ ! -e "$root/etc/resolv.conf" ]; then
    rm -f "$root/etc/resolv.conf"
    touch "$root/etc/resolv.conf"
  fi
  mount --bind "$(realpath /etc/resolv.conf)" "$root/etc/resolv.conf"
  mount -o remount,bind,ro "$root/etc/resolv.conf"

  local i kind spec src dst
  for ((i = 0; i < ${#binds[@]}; i += 2)); do
    kind=${binds[i]}
    spec=${binds[i + 1]}
    src=${spec%%:*}
    dst=${spec#*:}
    [ "$spec" = "$src" ] && dst=$src
    [ -e "$src" ] || _chroot_die "chroot_exec: bind source $src does not exist"
    case "$dst" in /*) ;; *) _chroot_die "chroot_exec: bind destination $dst must be absolute" ;; esac
    if [ -d "$src" ]; then
      mkdir -p "$root$dst"
    else
      mkdir -p "$(dirname "$root$dst")"
      [ -e "$root$dst" ] || touch "$root$dst"
    fi
    mount --bind "$src" "$root$dst"
    [ "$kind" = --ro-bind ] && mount -o remount,bind,ro "$root$dst"
  done

  exec chroot "$root" /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" DEBIAN_FRONTEND=noninteractive \
    "${envs[@]}" "$@"
}

# chroot_exec_into ROOT [options as chroot_exec] -- CMD...
# chroot_exec, but replaces the calling shell: CMD keeps the caller's PID (unshare and chroot exec
# in place). For wrapper scripts whose callers signal or wait for the PID they started.
chroot_exec_into() {
  local root=${1:?chroot_exec_into ROOT [--bind SRC[:DST]]... [--ro-bind SRC[:DST]]... -- CMD...}
  shift
  [ -d "$root" ] || { _chroot_die "chroot_exec_into: $root is not a directory"; return 1; }
  [ "$(id -u)" -eq 0 ] || { _chroot_die "chroot_exec_into needs root (mount namespaces)"; return 1; }
  exec unshare -m --propagation private -- bash "${BASH_SOURCE[0]}" __chroot_exec_inner "$root" "$@"
}

# chroot_apt_update_opts SUITE
# Prints the option `apt-get update` needs for SUITE: sid's Release file may be past its Valid-Until on
# a mirror that lags (apt then refuses it), so that check is off for sid only.
chroot_apt_update_opts() {
  _chroot_check_suite "$1" || return 1
  if [ "$1" = sid ]; then echo "-oAcquire::Check-Valid-Until=false"; else echo "-oAPT::Get::List-Cleanup=true"; fi
}

# chroot_with_packages SUITE VARIANT PKG...
# Prints the path of a cached chroot: the base of SUITE/VARIANT plus PKG... installed with apt
# (--no-install-recommends), made once per machine under a flock like the base, at
# <cache>/<suite>-<variant>-pkgs-<hash of the sorted package list>/root (the list is in .../packages).
# Made again when the base is newer than it. Treat it as read-only (copy it to change it).
chroot_with_packages() {
  local suite=${1:?chroot_with_packages SUITE VARIANT PKG...} variant=${2:?chroot_with_packages SUITE VARIANT PKG...}
  shift 2
  [ $# -gt 0 ] || { _chroot_die "chroot_with_packages: no package named"; return 1; }
  local base cache key dir
  base=$(chroot_base "$suite" "$variant") || return 1
  cache=$(chroot_cache_dir)
  key=$(printf '%s\n' "$@" | sort -u | sha256sum | cut -c1-12)
  dir="$cache/$suite-$variant-pkgs-$key"
  (
    exec 9>"$dir.lock"
    flock 9
    if [ -f "$dir/complete" ] && [ -d "$dir/root" ] && ! [ "$dir/complete" -ot "$(dirname "$base")/complete" ]; then
      exit 0
    fi
    if [ -e "$dir" ]; then
      echo "chroot.sh: removing the unfinished or outdated chroot $dir" >&2
      _chroot_remove "$dir" || exit 1
    fi
    mkdir -p "$dir/root"
    cp -a --reflink=auto "$base/." "$dir/root/" || { _chroot_die "copying $base to $dir failed"; exit 1; }
    archives=$(chroot_apt_archives "$suite") || exit 1
    echo "chroot.sh: installing $* into a $suite chroot at $dir/root (once per machine)" >&2
    if ! chroot_exec "$dir/root" --bind "$archives:/var/cache/apt/archives" -- sh -c \
         'apt-get $0 update -qq && apt-get install -y -qq --no-install-recommends "$@"' "$(chroot_apt_update_opts "$suite")" "$@" >"$dir/install.log" 2>&1; then
      _chroot_die "installing $* into the $suite chroot failed; see $dir/install.log (last lines below)"
      tail -n 15 "$dir/install.log" >&2
      exit 1
    fi
    printf '%s\n' "$@" >"$dir/packages"
    date -u +%FT%TZ >"$dir/complete"
  ) || return 1
  printf '%s\n' "$dir/root"
}

# Executed (not sourced) by chroot_exec inside `unshare -m`.
if [ "${BASH_SOURCE[0]}" = "$0" ] && [ "${1:-}" = __chroot_exec_inner ]; then
  shift
  _chroot_exec_inner "$@"
fi
