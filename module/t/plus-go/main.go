// Command plus-go drives an NGINX Plus API endpoint through Debian's nginx-plus-go-client (the Go
// client nginx-asg-sync and NGINX's Kubernetes ingress controller use), so the module's tests can
// show that the field's own client works against nginx with the combined-upstreams module.
//
// It is built in GOPATH mode against the client's sources that the Debian package
// golang-github-nginxinc-nginx-plus-go-client-dev installs in /usr/share/gocode:
//
//	GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=target/plus-go/cache \
//	  go build -o target/plus-go/plus-go ./module/t/plus-go
//
// Every command prints one JSON document on stdout and exits 0, or prints the client's error on
// stderr and exits 1 (2 for a usage error). URL is the API's root, e.g. http://127.0.0.1:8080/api.
// A SERVER is an address ("127.0.0.1:8081") or a JSON object in the client's UpstreamServer form
// ({"server":"127.0.0.1:8081","weight":2,"down":true}).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nginxinc/nginx-plus-go-client/client"
)

const usage = `usage: plus-go [-api-version N] COMMAND ARGS...

commands (each prints JSON):
  upstreams URL                    GetUpstreams: the client's view of every HTTP upstream
  stats URL                        GetStats: every endpoint the client reads for the exporter
  servers URL UPSTREAM             GetHTTPServers
  add URL UPSTREAM SERVER          AddHTTPServer
  update URL UPSTREAM SERVER...    UpdateHTTPServers: {"added":[],"deleted":[],"updated":[]}
  delete URL UPSTREAM ADDRESS      DeleteHTTPServer
  grow URL UPSTREAM ADDRESS...     for each ADDRESS in turn: GetHTTPServers, then UpdateHTTPServers
                                   with the servers read plus ADDRESS (one writer of several merging
                                   its own servers into the set); prints the addresses the client
                                   reported added, deleted and updated over all calls
`

func main() {
	flags := flag.NewFlagSet("plus-go", flag.ContinueOnError)
	version := flags.Int("api-version", client.APIVersion, "NGINX Plus API version the client speaks")
	flags.SetOutput(os.Stderr)
	flags.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	if err := flags.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	args := flags.Args()
	if len(args) == 1 && args[0] == "help" {
		fmt.Print(usage)
		return
	}
	if len(args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, url, rest := args[0], args[1], args[2:]
	out, err := run(cmd, url, *version, rest)
	if err != nil {
		fmt.Fprintf(os.Stderr, "plus-go %s: %v\n", cmd, err)
		if _, bad := err.(usageError); bad {
			os.Exit(2)
		}
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "plus-go %s: encode: %v\n", cmd, err)
		os.Exit(1)
	}
}

type usageError string

func (e usageError) Error() string { return string(e) + "\n" + usage }

func need(rest []string, n int, what string) error {
	if len(rest) != n {
		return usageError(fmt.Sprintf("expected %s", what))
	}
	return nil
}

func run(cmd, url string, version int, rest []string) (interface{}, error) {
	switch cmd {
	case "upstreams", "stats", "servers", "add", "update", "delete", "grow":
	default:
		return nil, usageError(fmt.Sprintf("unknown command %q", cmd))
	}
	c, err := client.NewNginxClientWithVersion(&http.Client{Timeout: 15 * time.Second}, url, version)
	if err != nil {
		return nil, err
	}
	switch cmd {
	case "upstreams":
		if err := need(rest, 0, "no arguments after URL"); err != nil {
			return nil, err
		}
		return c.GetUpstreams()
	case "stats":
		if err := need(rest, 0, "no arguments after URL"); err != nil {
			return nil, err
		}
		return c.GetStats()
	case "servers":
		if err := need(rest, 1, "UPSTREAM"); err != nil {
			return nil, err
		}
		return c.GetHTTPServers(rest[0])
	case "add":
		if err := need(rest, 2, "UPSTREAM SERVER"); err != nil {
			return nil, err
		}
		s, err := parseServer(rest[1])
		if err != nil {
			return nil, err
		}
		if err := c.AddHTTPServer(rest[0], s); err != nil {
			return nil, err
		}
		return map[string]string{"added": s.Server}, nil
	case "update":
		if len(rest) < 1 {
			return nil, usageError("expected UPSTREAM SERVER...")
		}
		servers := []client.UpstreamServer{}
		for _, a := range rest[1:] {
			s, err := parseServer(a)
			if err != nil {
				return nil, err
			}
			servers = append(servers, s)
		}
		added, deleted, updated, err := c.UpdateHTTPServers(rest[0], servers)
		if err != nil {
			return nil, err
		}
		return diff{Added: orEmpty(added), Deleted: orEmpty(deleted), Updated: orEmpty(updated)}, nil
	case "delete":
		if err := need(rest, 2, "UPSTREAM ADDRESS"); err != nil {
			return nil, err
		}
		if err := c.DeleteHTTPServer(rest[0], rest[1]); err != nil {
			return nil, err
		}
		return map[string]string{"deleted": rest[1]}, nil
	default: // grow
		if len(rest) < 2 {
			return nil, usageError("expected UPSTREAM ADDRESS...")
		}
		return grow(c, rest[0], rest[1:])
	}
}

type diff struct {
	Added   []client.UpstreamServer `json:"added"`
	Deleted []client.UpstreamServer `json:"deleted"`
	Updated []client.UpstreamServer `json:"updated"`
}

func orEmpty(s []client.UpstreamServer) []client.UpstreamServer {
	if s == nil {
		return []client.UpstreamServer{}
	}
	return s
}

// grow merges each address into the upstream's set with UpdateHTTPServers: the list it hands the
// client is the set it just read plus the new address. UpdateHTTPServers reads the set again
// itself, so with another writer at work the two reads can differ: a server of the other writer
// that appeared in between is deleted, and one of ours that the other writer deleted in between
// is added again. The diffs say so; the caller accounts for every add and delete reported.
func grow(c *client.NginxClient, upstream string, addrs []string) (interface{}, error) {
	type report struct {
		Added   []string `json:"added"`
		Deleted []string `json:"deleted"`
		Updated []string `json:"updated"`
		Calls   int      `json:"calls"`
	}
	r := report{Added: []string{}, Deleted: []string{}, Updated: []string{}}
	for _, a := range addrs {
		cur, err := c.GetHTTPServers(upstream)
		if err != nil {
			return nil, err
		}
		// The servers as a caller would list them (nginx-asg-sync builds them without ids): the
		// client would send an id it was given back in a POST when it adds one again.
		want := make([]client.UpstreamServer, 0, len(cur)+1)
		for _, s := range cur {
			s.ID = 0
			want = append(want, s)
		}
		want = append(want, client.UpstreamServer{Server: a})
		added, deleted, updated, err := c.UpdateHTTPServers(upstream, want)
		r.Calls++
		for _, s := range added {
			r.Added = append(r.Added, s.Server)
		}
		for _, s := range deleted {
			r.Deleted = append(r.Deleted, s.Server)
		}
		for _, s := range updated {
			r.Updated = append(r.Updated, s.Server)
		}
		if err != nil {
			return nil, fmt.Errorf("after %d calls (%+v): %w", r.Calls, r, err)
		}
	}
	return r, nil
}

func parseServer(arg string) (client.UpstreamServer, error) {
	var s client.UpstreamServer
	if !strings.HasPrefix(strings.TrimSpace(arg), "{") {
		s.Server = arg
		return s, nil
	}
	dec := json.NewDecoder(strings.NewReader(arg))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, usageError(fmt.Sprintf("SERVER %q: %v", arg, err))
	}
	if s.Server == "" {
		return s, usageError(fmt.Sprintf("SERVER %q has no \"server\"", arg))
	}
	return s, nil
}
