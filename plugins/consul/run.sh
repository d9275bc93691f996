#!/bin/sh
exec "$(dirname "$0")/../launch.sh" tributary-plugin-consul "$@"
