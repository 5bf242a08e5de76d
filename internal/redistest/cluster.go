package redistest

import (
	"context"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultClusterURL is the Redis Cluster used when TEST_REDIS_CLUSTER_URL is unset: the three
// masters that scripts/redis-cluster.sh starts (make test has scripts/services.sh --with-cluster
// call it).
const DefaultClusterURL = "redis-cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"

// ClusterURL returns TEST_REDIS_CLUSTER_URL or DefaultClusterURL.
func ClusterURL() string { return envOr("TEST_REDIS_CLUSTER_URL", DefaultClusterURL) }

// Target is one kind of Redis deployment that llmq supports, for tests that must hold on each.
type Target struct {
	// Name names the subtest: "Single" or "Cluster".
	Name string
	// URL is the shared test deployment (URL or ClusterURL), in llmq's redis_url syntax.
	URL string
	// Private starts a deployment of this kind for the test alone (Server or ClusterServer), for
	// what no shared one allows (FLUSHALL, a restart), and returns its URL.
	Private func(testing.TB) string
}

// Targets are the deployments a test of Redis-facing behaviour runs against: the single Redis
// and the Redis Cluster.
func Targets() []Target {
	return []Target{
		{Name: "Single", URL: URL(), Private: Server},
		{Name: "Cluster", URL: ClusterURL(), Private: ClusterServer},
	}
}

// OnEach runs body as a parallel subtest, named after the target, on each of Targets: a test of
// Redis-facing behaviour that must hold on a single Redis and on a Redis Cluster alike.
func OnEach(t *testing.T, body func(t *testing.T, target Target)) {
	t.Helper()
	for _, target := range Targets() {
		t.Run(target.Name, func(t *testing.T) {
			t.Parallel()
			body(t, target)
		})
	}
}

// ClientOf returns a client to the Redis or Redis Cluster at url, closed in t.Cleanup: a
// redis-cluster://host:port,host:port URL (dispatch.RedisConnOpt's syntax; redistest cannot
// import dispatch, whose package jobs has tests that use pgtest, which uses redistest) or any
// form redis.ParseURL takes. The test fails (it does not skip) when it is unreachable: a
// cluster's every master must answer.
func ClientOf(t testing.TB, url string) redis.UniversalClient {
	t.Helper()
	c, err := newClient(url)
	if err != nil {
		t.Fatalf("parse redis url %s: %v", url, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return node.Ping(ctx).Err() })
	} else {
		err = c.Ping(ctx).Err()
	}
	if err != nil {
		t.Fatalf("redis unreachable at %s (make test starts it: scripts/services.sh --with-cluster): %v", url, err)
	}
	return c
}

func newClient(raw string) (redis.UniversalClient, error) {
	rest, ok := strings.CutPrefix(raw, "redis-cluster://")
	if !ok {
		opt, err := redis.ParseURL(raw)
		if err != nil {
			return nil, err
		}
		return redis.NewClient(opt), nil
	}
	u, err := neturl.Parse("redis://" + rest)
	if err != nil {
		return nil, err
	}
	opt := &redis.ClusterOptions{Addrs: strings.Split(u.Host, ",")}
	if u.User != nil {
		opt.Username = u.User.Username()
		opt.Password, _ = u.User.Password()
	}
	return redis.NewClusterClient(opt), nil
}

// Queue returns a fresh asynq queue name "llmq-test-<rand>" on the Redis at url, and removes
// every key of the queue and of the queues named after it (llmq's low queue, "<queue>:low";
// asynq keeps a queue's keys under "asynq:{<queue>}:", completed tasks and
// daily counters included) and their entries in asynq's list of queues when the test ends.
// Register it before starting the servers and clients that use the queue, so that it runs after
// they stopped.
func Queue(t testing.TB, url string) string {
	t.Helper()
	q := "llmq-test-" + Rand()
	c := ClientOf(t, url)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		Unlink(ctx, c, "asynq:{"+q+"}:*")
		Unlink(ctx, c, "asynq:{"+q+":*")
		names, _ := c.SMembers(ctx, "asynq:queues").Result()
		for _, name := range names {
			if name == q || strings.HasPrefix(name, q+":") {
				c.SRem(ctx, "asynq:queues", name)
			}
		}
	})
	return q
}

// FlushAll empties the Redis behind c: every master of a cluster.
func FlushAll(ctx context.Context, c redis.UniversalClient) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return node.FlushAll(ctx).Err()
		})
	}
	return c.FlushAll(ctx).Err()
}

// NumSub counts the subscribers of a (classic) Pub/Sub channel on the Redis behind c: on every
// master of a cluster, where PUBSUB NUMSUB counts one node's own.
func NumSub(ctx context.Context, c redis.UniversalClient, channel string) (int64, error) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		n, err := c.PubSubNumSub(ctx, channel).Result()
		return n[channel], err
	}
	var total atomic.Int64
	err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		n, err := node.PubSubNumSub(ctx, channel).Result()
		total.Add(n[channel])
		return err
	})
	return total.Load(), err
}

// clusterNodes is the size of a ClusterServer: three masters, as scripts/redis-cluster.sh starts.
const clusterNodes = 3

// ClusterServer starts a private three-master Redis Cluster on free loopback ports for tests
// that must do what no shared cluster allows (FLUSHALL on every master). It is stopped when the
// test ends. It returns its redis-cluster:// URL once the cluster is ok.
func ClusterServer(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	ports := make([]int, clusterNodes)
	clients := make([]*redis.Client, clusterNodes)
	addrs := make([]string, clusterNodes)
	for i := range ports {
		for ports[i] == 0 || slices.Contains(ports[:i], ports[i]) {
			ports[i] = freeClusterPort(t)
		}
		addrs[i] = "127.0.0.1:" + strconv.Itoa(ports[i])
		nodeDir := fmt.Sprintf("%s/%d", dir, i)
		if err := os.Mkdir(nodeDir, 0o755); err != nil {
			t.Fatal(err)
		}
		clients[i] = startServer(t, ports[i], nodeDir, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// What redis-cli --cluster create does, without its one-second waits: distinct config epochs,
	// an equal share of the 16384 slots each, and every node introduced to the first.
	for i, c := range clients {
		lo, hi := i*16384/clusterNodes, (i+1)*16384/clusterNodes-1
		for _, args := range [][]any{{"cluster", "set-config-epoch", i + 1}, {"cluster", "addslotsrange", lo, hi}} {
			if err := c.Do(ctx, args...).Err(); err != nil {
				t.Fatalf("form private cluster: %v on port %d: %v", args, ports[i], err)
			}
		}
	}
	for i, c := range clients[1:] {
		if err := c.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(ports[0])).Err(); err != nil {
			t.Fatalf("form private cluster: meet from port %d: %v", ports[i+1], err)
		}
	}
	for i, c := range clients {
		for !clusterOK(ctx, c) {
			if ctx.Err() != nil {
				t.Fatalf("private cluster node on port %d did not reach cluster_state:ok", ports[i])
			}
			time.Sleep(20 * time.Millisecond) // polling the nodes' gossip; there is no signal to wait on
		}
	}
	return "redis-cluster://" + strings.Join(addrs, ",")
}

// clusterOK says whether node c sees the whole cluster serving every slot.
func clusterOK(ctx context.Context, c *redis.Client) bool {
	info, err := c.ClusterInfo(ctx).Result()
	return err == nil && strings.Contains(info, "cluster_state:ok") &&
		strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(clusterNodes)+"\r") &&
		strings.Contains(info, "cluster_slots_ok:16384")
}

// freeClusterPort returns a free loopback port whose cluster bus port (10000 above it) is free
// too.
func freeClusterPort(t testing.TB) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err != nil {
			continue
		}
		_ = bus.Close()
		return port
	}
	t.Fatal("no free port pair for a cluster node")
	return 0
}
