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
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
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
  grow URL UPSTREAM WORKERS ADDRESS...
                                   WORKERS goroutines, each merging its share of the ADDRESSes into
                                   the set one at a time: GetHTTPServers, then UpdateHTTPServers with
                                   the servers read plus the address (a call that fails because
                                   another writer was quicker is tried again); prints every server
                                   the API acknowledged creating (POST 201, with its id) and every
                                   id it acknowledged deleting (DELETE 200)
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
		if len(rest) < 3 {
			return nil, usageError("expected UPSTREAM WORKERS ADDRESS...")
		}
		workers, err := strconv.Atoi(rest[1])
		if err != nil || workers < 1 {
			return nil, usageError(fmt.Sprintf("WORKERS %q: a number of goroutines, 1 or more", rest[1]))
		}
		return grow(url, rest[0], version, workers, rest[2:])
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

// grow merges each address into the upstream's set with UpdateHTTPServers, from `workers`
// goroutines at once (each with its own client, the addresses dealt out in turn): the list a
// goroutine hands the client is the set it just read (as read, ids included: when the client
// adds one of them again, its POST carries the old id, which the API must ignore) plus the new
// address. UpdateHTTPServers reads the set again itself, so with other
// writers at work the two reads differ: the client deletes a server that appeared in between and
// adds again one that went, and it fails when another writer was quicker (a server that exists
// already, or is gone). Such a call is tried again (up to 20 times). What the API acknowledged is
// recorded below the client, from the HTTP exchanges: every server a POST created (201, with the
// id the answer gives) and every id a DELETE removed (200): the caller checks the final set
// against exactly that.
func grow(url, upstream string, version, workers int, addrs []string) (interface{}, error) {
	rec := &recorder{base: http.DefaultTransport}
	type report struct {
		Created []createdServer `json:"created"`
		Deleted []uint64        `json:"deleted_ids"`
		Calls   int             `json:"calls"`
		Retried int             `json:"retried"`
		Errors  []string        `json:"errors"`
	}
	var mu sync.Mutex
	r := report{Errors: []string{}}
	var wg sync.WaitGroup
	failed := make(chan error, workers)
	for w := 0; w < workers; w++ {
		var mine []string
		for i := w; i < len(addrs); i += workers {
			mine = append(mine, addrs[i])
		}
		c, err := client.NewNginxClientWithVersion(&http.Client{Timeout: 15 * time.Second, Transport: rec}, url, version)
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func(mine []string) {
			defer wg.Done()
			for _, a := range mine {
				var last error
				for attempt := 0; attempt < 20; attempt++ {
					last = mergeOne(c, upstream, a)
					mu.Lock()
					r.Calls++
					if last != nil {
						r.Retried++
						if len(r.Errors) < 10 {
							r.Errors = append(r.Errors, last.Error())
						}
					}
					mu.Unlock()
					if last == nil {
						break
					}
				}
				if last != nil {
					failed <- fmt.Errorf("%s: 20 attempts failed, the last: %w", a, last)
					return
				}
			}
		}(mine)
	}
	wg.Wait()
	close(failed)
	if err := <-failed; err != nil {
		return nil, err
	}
	r.Created, r.Deleted = rec.created, rec.deleted
	return r, nil
}

// mergeOne: the set as read plus addr, through UpdateHTTPServers.
func mergeOne(c *client.NginxClient, upstream, addr string) error {
	cur, err := c.GetHTTPServers(upstream)
	if err != nil {
		return err
	}
	want := make([]client.UpstreamServer, 0, len(cur)+1)
	for _, s := range cur {
		if s.Server == addr {
			return nil // in the set already (an earlier attempt's add went through)
		}
		want = append(want, s)
	}
	want = append(want, client.UpstreamServer{Server: addr})
	_, _, _, err = c.UpdateHTTPServers(upstream, want)
	return err
}

type createdServer struct {
	ID     uint64 `json:"id"`
	Server string `json:"server"`
}

// recorder is the clients' transport: it passes every exchange on and notes what the API
// acknowledged, a server created by a POST (201) or an id removed by a DELETE (200).
type recorder struct {
	base    http.RoundTripper
	mu      sync.Mutex
	created []createdServer
	deleted []uint64
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	switch {
	case req.Method == http.MethodPost && resp.StatusCode == http.StatusCreated:
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var s createdServer
		if err := json.Unmarshal(body, &s); err != nil || s.Server == "" {
			return nil, fmt.Errorf("POST %s answered 201 without a server: %q", req.URL.Path, body)
		}
		r.mu.Lock()
		r.created = append(r.created, s)
		r.mu.Unlock()
	case req.Method == http.MethodDelete && resp.StatusCode == http.StatusOK:
		parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
		id, err := strconv.ParseUint(parts[len(parts)-1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("DELETE %s: no id in the path", req.URL.Path)
		}
		r.mu.Lock()
		r.deleted = append(r.deleted, id)
		r.mu.Unlock()
	}
	return resp, nil
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
