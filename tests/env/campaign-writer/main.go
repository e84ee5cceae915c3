// The fault campaign's client (tests/e2e/benches/fault_campaign.rs): it writes to and reads
// from an etcd cluster while the campaign hurts it, records every operation with its
// invocation and return times, and checks the history with porcupine, an existing
// linearizability checker (github.com/anishathalye/porcupine), against a key-value model.
//
// Three things run at once until standard input closes:
//   - clients doing puts and gets on a few keys (the history porcupine checks); a put that
//     fails or times out has an unknown outcome: it may have taken effect at any time after
//     its invocation, so its return time is infinite (porcupine's convention); a failed get
//     constrains nothing and is left out;
//   - an appender putting one unique key after another (`ack/<n>`): the acknowledged ones are
//     the writes that must all be there at the end;
//   - a monitor asking every member endpoint for a linearizable read (quorum) and the member
//     list, twice a second.
//
// Then it reads every register key and the `ack/` prefix back (retrying until the cluster
// answers), checks the history and prints one JSON report on standard output. The member
// endpoints are read from a file the campaign rewrites as pods come and go.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

type kvInput struct {
	Put   bool
	Key   string
	Value string
}

type kvOutput struct {
	Value   string
	Unknown bool
}

// A register per key: a get returns the last put's value ("" before any put).
var kvModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			key := op.Input.(kvInput).Key
			byKey[key] = append(byKey[key], op)
		}
		keys := make([]string, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() interface{} { return "" },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		in := input.(kvInput)
		if in.Put {
			return true, in.Value
		}
		return output.(kvOutput).Value == state.(string), state
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(kvInput)
		if in.Put {
			if output.(kvOutput).Unknown {
				return fmt.Sprintf("put(%s, %s) -> unknown", in.Key, in.Value)
			}
			return fmt.Sprintf("put(%s, %s)", in.Key, in.Value)
		}
		return fmt.Sprintf("get(%s) -> %q", in.Key, output.(kvOutput).Value)
	},
}

type sample struct {
	// Unix milliseconds.
	T       int64    `json:"t"`
	Quorum  bool     `json:"quorum"`
	Members []member `json:"members,omitempty"`
}

type member struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Learner bool   `json:"learner"`
}

type report struct {
	Operations    int      `json:"operations"`
	PutsOk        int      `json:"putsOk"`
	PutsUnknown   int      `json:"putsUnknown"`
	GetsOk        int      `json:"getsOk"`
	GetsFailed    int      `json:"getsFailed"`
	Acknowledged  int      `json:"acknowledged"`
	Lost          []string `json:"lost"`
	FinalRead     string   `json:"finalRead"`
	Linearizable  string   `json:"linearizable"`
	CheckMillis   int64    `json:"checkMillis"`
	Visualization string   `json:"visualization,omitempty"`
	Samples       []sample `json:"samples"`
}

type endpoints struct {
	mu   sync.Mutex
	list []string
}

func (e *endpoints) get() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.list...)
}

func readEndpoints(path string) []string {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, f := range strings.FieldsFunc(string(text), func(r rune) bool { return r == ',' || r == '\n' || r == ' ' }) {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

func newClient(eps []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:            eps,
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               zap.NewNop(),
	})
}

func now() int64 { return time.Now().UnixNano() }

// selfCheck shows the model and the checker tell a linearizable history from one that is not,
// before a campaign trusts their verdicts: an acknowledged put that a later get does not see
// is illegal; the same get overlapping the put, or after a put of unknown outcome, is not.
func selfCheck() error {
	put := func(value string, call, ret int64, unknown bool) porcupine.Operation {
		return porcupine.Operation{ClientId: 0, Input: kvInput{Put: true, Key: "r/0", Value: value}, Call: call, Output: kvOutput{Unknown: unknown}, Return: ret}
	}
	get := func(value string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 1, Input: kvInput{Key: "r/0"}, Call: call, Output: kvOutput{Value: value}, Return: ret}
	}
	cases := []struct {
		name    string
		history []porcupine.Operation
		want    bool
	}{
		{"a get after an acknowledged put sees it", []porcupine.Operation{put("a", 0, 10, false), get("a", 20, 30)}, true},
		{"a get after an acknowledged put misses it", []porcupine.Operation{put("a", 0, 10, false), get("", 20, 30)}, false},
		{"a get overlapping the put may miss it", []porcupine.Operation{put("a", 0, 25, false), get("", 20, 30)}, true},
		{"a put of unknown outcome may never happen", []porcupine.Operation{put("a", 0, math.MaxInt64, true), get("", 20, 30)}, true},
		{"a put of unknown outcome may happen late", []porcupine.Operation{put("a", 0, math.MaxInt64, true), get("", 20, 30), get("a", 40, 50)}, true},
		{"a value once read does not go back", []porcupine.Operation{put("a", 0, 10, false), put("b", 20, 30, false), get("b", 40, 50), get("a", 60, 70)}, false},
	}
	for _, c := range cases {
		if got := porcupine.CheckOperations(kvModel, c.history); got != c.want {
			return fmt.Errorf("%s: porcupine says linearizable=%v, want %v", c.name, got, c.want)
		}
	}
	return nil
}

func main() {
	endpointsFile := flag.String("endpoints-file", "", "file listing the member endpoints (http://ip:2379), rewritten by the campaign")
	keys := flag.Int("keys", 3, "register keys the clients put and get")
	clients := flag.Int("clients", 3, "concurrent clients on the registers")
	seed := flag.Int64("seed", 1, "seed of the clients' choices")
	outDir := flag.String("out", ".", "directory for the visualization of a history that is not linearizable")
	checkTimeout := flag.Duration("check-timeout", 60*time.Second, "how long porcupine may search")
	finalTimeout := flag.Duration("final-timeout", 60*time.Second, "how long the final reads may retry")
	selfCheckOnly := flag.Bool("self-check", false, "only check that the model and checker judge known histories right")
	flag.Parse()
	if *selfCheckOnly {
		if err := selfCheck(); err != nil {
			fmt.Fprintf(os.Stderr, "campaign-writer: self-check failed: %v\n", err)
			os.Exit(1)
		}
		fmt.Println("self-check ok")
		return
	}
	if *endpointsFile == "" {
		fmt.Fprintln(os.Stderr, "campaign-writer: -endpoints-file is required")
		os.Exit(2)
	}

	eps := &endpoints{list: readEndpoints(*endpointsFile)}
	for len(eps.get()) == 0 {
		time.Sleep(200 * time.Millisecond)
		eps.list = readEndpoints(*endpointsFile)
	}
	cli, err := newClient(eps.get())
	if err != nil {
		fmt.Fprintf(os.Stderr, "campaign-writer: connecting to %v: %v\n", eps.get(), err)
		os.Exit(1)
	}
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		close(stop)
	}()
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}

	// Follow the endpoints file.
	go func() {
		for !stopped() {
			time.Sleep(500 * time.Millisecond)
			next := readEndpoints(*endpointsFile)
			if len(next) == 0 || strings.Join(next, ",") == strings.Join(eps.get(), ",") {
				continue
			}
			eps.mu.Lock()
			eps.list = next
			eps.mu.Unlock()
			cli.SetEndpoints(next...)
		}
	}()

	var mu sync.Mutex
	var history []porcupine.Operation
	rep := report{Lost: []string{}}
	record := func(op porcupine.Operation) {
		mu.Lock()
		history = append(history, op)
		mu.Unlock()
	}

	var wg sync.WaitGroup
	for c := 0; c < *clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(*seed*1000 + int64(c)))
			for n := 0; !stopped(); n++ {
				key := fmt.Sprintf("r/%d", rng.Intn(*keys))
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				call := now()
				if rng.Intn(2) == 0 {
					value := fmt.Sprintf("c%d-%d", c, n)
					_, err := cli.Put(ctx, key, value)
					ret := now()
					out := kvOutput{}
					mu.Lock()
					if err != nil {
						ret = math.MaxInt64
						out.Unknown = true
						rep.PutsUnknown++
					} else {
						rep.PutsOk++
					}
					mu.Unlock()
					record(porcupine.Operation{ClientId: c, Input: kvInput{Put: true, Key: key, Value: value}, Call: call, Output: out, Return: ret})
				} else {
					resp, err := cli.Get(ctx, key)
					ret := now()
					mu.Lock()
					if err != nil {
						rep.GetsFailed++
						mu.Unlock()
					} else {
						rep.GetsOk++
						mu.Unlock()
						value := ""
						if len(resp.Kvs) > 0 {
							value = string(resp.Kvs[0].Value)
						}
						record(porcupine.Operation{ClientId: c, Input: kvInput{Key: key}, Call: call, Output: kvOutput{Value: value}, Return: ret})
					}
				}
				cancel()
				// The pace of a client, not a wait for anything: keeps the history checkable.
				time.Sleep(time.Duration(20+rng.Intn(30)) * time.Millisecond)
			}
		}(c)
	}

	var acknowledged []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; !stopped(); n++ {
			key := fmt.Sprintf("ack/%06d", n)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if _, err := cli.Put(ctx, key, "v"); err == nil {
				mu.Lock()
				acknowledged = append(acknowledged, key)
				mu.Unlock()
			}
			cancel()
			time.Sleep(100 * time.Millisecond)
		}
	}()

	var samples []sample
	wg.Add(1)
	go func() {
		defer wg.Done()
		perEndpoint := map[string]*clientv3.Client{}
		defer func() {
			for _, c := range perEndpoint {
				c.Close()
			}
		}()
		for !stopped() {
			s := sample{T: time.Now().UnixMilli()}
			var smu sync.Mutex
			var swg sync.WaitGroup
			for _, ep := range eps.get() {
				c, ok := perEndpoint[ep]
				if !ok {
					fresh, err := newClient([]string{ep})
					if err != nil {
						continue
					}
					c = fresh
					perEndpoint[ep] = c
				}
				swg.Add(1)
				go func(c *clientv3.Client) {
					defer swg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					defer cancel()
					if _, err := c.Get(ctx, "probe"); err != nil {
						return
					}
					list, err := c.MemberList(ctx)
					smu.Lock()
					defer smu.Unlock()
					s.Quorum = true
					if err == nil && s.Members == nil {
						s.Members = []member{}
						for _, m := range list.Members {
							s.Members = append(s.Members, member{ID: fmt.Sprintf("%x", m.ID), Name: m.Name, Learner: m.IsLearner})
						}
					}
				}(c)
			}
			swg.Wait()
			samples = append(samples, s)
			time.Sleep(500 * time.Millisecond)
		}
	}()
	<-stop
	wg.Wait()

	// The final reads, part of the history: what the cluster holds once it is back.
	deadline := time.Now().Add(*finalTimeout)
	rep.FinalRead = "ok"
	for k := 0; k < *keys; k++ {
		key := fmt.Sprintf("r/%d", k)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			call := now()
			resp, err := cli.Get(ctx, key)
			ret := now()
			cancel()
			if err == nil {
				value := ""
				if len(resp.Kvs) > 0 {
					value = string(resp.Kvs[0].Value)
				}
				record(porcupine.Operation{ClientId: *clients, Input: kvInput{Key: key}, Call: call, Output: kvOutput{Value: value}, Return: ret})
				break
			}
			if time.Now().After(deadline) {
				rep.FinalRead = fmt.Sprintf("get %s: %v", key, err)
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.Get(ctx, "ack/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err == nil {
			held := map[string]bool{}
			for _, kv := range resp.Kvs {
				held[string(kv.Key)] = true
			}
			for _, key := range acknowledged {
				if !held[key] {
					rep.Lost = append(rep.Lost, key)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			rep.FinalRead = fmt.Sprintf("get ack/ prefix: %v", err)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	cli.Close()

	rep.Operations = len(history)
	rep.Acknowledged = len(acknowledged)
	rep.Samples = samples
	started := time.Now()
	result, info := porcupine.CheckOperationsVerbose(kvModel, history, *checkTimeout)
	rep.CheckMillis = time.Since(started).Milliseconds()
	switch result {
	case porcupine.Ok:
		rep.Linearizable = "ok"
	case porcupine.Illegal:
		rep.Linearizable = "illegal"
	default:
		rep.Linearizable = "unknown"
	}
	if result != porcupine.Ok {
		path := filepath.Join(*outDir, fmt.Sprintf("history-%d.html", *seed))
		if err := porcupine.VisualizePath(kvModel, info, path); err == nil {
			rep.Visualization = path
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		fmt.Fprintf(os.Stderr, "campaign-writer: writing the report: %v\n", err)
		os.Exit(1)
	}
}
