package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

// repoRoot is the repository's root, seen from this package's directory.
const repoRoot = "../.."

// TestReadme_Examples runs the shell examples of README.md as written (see readme_script_test.go
// for the conventions), against a stack of its own: the bin/ programs the README uses built into
// a temporary directory that stands for the repository, the simulator, and llmq on the test's own
// database and a private redis-server, with configs/local.yaml rewritten to point at them; llmq
// in each layout the README offers: `llmq serve` as `make run` runs it, and an API and a worker
// process. localhost:8080 and :8090 in the examples are the test's API and simulator. It fails on
// any failing command and on any output that differs from the README's `# => TEXT`.
func TestReadme_Examples(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "jq"} {
		_, err := exec.LookPath(tool)
		require.NoError(t, err, "the README's examples need %s", tool)
	}
	md, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	script, err := readmeScript(string(md))
	require.NoError(t, err)
	for _, serve := range []bool{true, false} {
		name := "APIAndWorker"
		if serve {
			name = "Serve"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runReadme(t, startReadmeStack(t, serve), script)
		})
	}
}

// runReadme runs the README's examples, script, against s.
func runReadme(t *testing.T, s *readmeStack, script string) {
	t.Helper()
	script = strings.NewReplacer(
		"localhost:8080", s.apiAddr, "127.0.0.1:8080", s.apiAddr,
		"localhost:8090", s.simAddr, "127.0.0.1:8090", s.simAddr,
	).Replace(script)
	for _, addr := range regexp.MustCompile(`(localhost|127\.0\.0\.1):\d+`).FindAllString(script, -1) {
		require.Contains(t, []string{s.apiAddr, s.simAddr}, addr, "the README's examples use %s, which this test does not run", addr)
	}
	path := filepath.Join(s.dir, "readme.sh")
	require.NoError(t, os.WriteFile(path, []byte(script), 0o600))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", path)
	cmd.Dir, cmd.Env = s.dir, s.env()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group, so that a timeout also ends the curl it waits for.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil || t.Failed() {
		t.Logf("README examples (trace and output):\n%s", out.String())
		t.Logf("api log:\n%s", s.api.log.String())
		if s.worker != nil {
			t.Logf("worker log:\n%s", s.worker.log.String())
		}
	}
	require.NoError(t, ctx.Err(), "the README's examples did not end within 3 minutes")
	require.NoError(t, err, "a README example failed; the first README.md:N line above names it")
}

// TestReadme_Script checks the conventions the README test relies on, on a small markdown.
func TestReadme_Script(t *testing.T) {
	t.Parallel()
	md := "# t\n" +
		"```sh\nx=hi\necho $x          # => hi\n```\n" +
		"<!-- not run: needs a terminal -->\n```sh\nexit 7\n```\n" +
		"```yaml\na: 1\n```\n"
	script, err := readmeScript(md)
	require.NoError(t, err)
	require.Equal(t, strings.Count(md, "\n"), strings.Count(script, "\n"), "one script line per README line")
	require.NotContains(t, script, "exit 7", "the marked block is skipped")
	require.NotContains(t, script, "a: 1", "the yaml block is not run")
	out, err := bashOutput(script)
	require.NoError(t, err, "%s", out)

	bad, err := readmeScript(strings.Replace(md, "# => hi", "# => ho", 1))
	require.NoError(t, err)
	out, err = bashOutput(bad)
	require.Error(t, err)
	require.Contains(t, out, `README.md:4: printed hi, the README says ho`)

	failing, err := readmeScript(strings.Replace(md, "x=hi", "false", 1))
	require.NoError(t, err)
	out, err = bashOutput(failing)
	require.Error(t, err)
	require.Contains(t, out, "README.md:3: exit status 1")

	for name, md := range map[string]string{
		"BashBlock":      "# t\n```bash\necho\n```\n",
		"NoLanguage":     "# t\n```\necho\n```\n",
		"MarkerOnYAML":   "# t\n<!-- not run: x -->\n```yaml\na: 1\n```\n",
		"MarkerNoReason": "# t\n<!-- not run -->\n```sh\necho\n```\n",
		"Unclosed":       "# t\n```sh\necho\n",
		"NothingToRun":   "# t\n<!-- not run: x -->\n```sh\necho\n```\n",
	} {
		_, err := readmeScript(md)
		require.Error(t, err, name)
	}
}

// bashOutput runs script with bash, for 30 s at most, and returns its combined output.
func bashOutput(script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", "-c", script).CombinedOutput()
	return string(out), err
}

// TestReadme_NamesExist holds the references to the repository of the README and of the
// documents under docs/: every test they name as the holder of a guarantee exists, every file
// they name exists, and no file of the repository refers to a file outside it (see escapesRepo).
func TestReadme_NamesExist(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	docs = append([]string{filepath.Join(repoRoot, "README.md")}, docs...)
	declared := map[string]bool{}
	funcName := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)\w+)\(`)
	require.NoError(t, filepath.WalkDir(repoRoot, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != repoRoot && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" ||
			d.Name() == "testdata" || p == filepath.Join(repoRoot, "bin")) {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return nil
		}
		// Built binaries (bin/, bench/bench) are no documents; reading them took most of a minute.
		if info, err := d.Info(); err != nil || info.Size() > 1<<20 {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, ref := range escapesRepo(p, b) {
			t.Errorf("%s refers to %q, outside the repository", strings.TrimPrefix(p, repoRoot+"/"), ref)
		}
		if strings.HasSuffix(p, "_test.go") {
			for _, m := range funcName.FindAllSubmatch(b, -1) {
				declared[string(m[1])] = true
			}
		}
		return nil
	}))
	for _, doc := range docs {
		md, err := os.ReadFile(doc)
		require.NoError(t, err)
		name := strings.TrimPrefix(doc, repoRoot+"/")
		for _, m := range regexp.MustCompile("`((?:Test|Fuzz)[A-Z]\\w*)`").FindAllStringSubmatch(string(md), -1) {
			require.True(t, declared[m[1]], "%s names test %s, which does not exist", name, m[1])
		}
		for _, m := range regexp.MustCompile("`([a-z][\\w.-]*(?:/[\\w.-]+)+\\.[a-z]+)`").FindAllStringSubmatch(string(md), -1) {
			_, err := os.Stat(filepath.Join(repoRoot, m[1]))
			require.NoError(t, err, "%s names the file %s", name, m[1])
		}
	}
}

// TestConfigurationDoc_NamesEverySetting: the README sends readers to docs/configuration.md for
// "every setting and its default", so every field of the config file (each yaml name of
// config.Config, nested ones too) is named there, in backquotes.
func TestConfigurationDoc_NamesEverySetting(t *testing.T) {
	t.Parallel()
	md, err := os.ReadFile(filepath.Join(repoRoot, "docs", "configuration.md"))
	require.NoError(t, err)
	for _, f := range yamlFields(reflect.TypeFor[config.Config](), "") {
		name := f[strings.LastIndex(f, ".")+1:]
		if !bytes.Contains(md, []byte("`"+name+"`")) && !bytes.Contains(md, []byte("`"+name+"[]`")) {
			t.Errorf("docs/configuration.md does not name the setting %s", f)
		}
	}
}

// yamlFields returns the yaml paths (api.listen, credentials[].batch.window) of the settings of
// struct type typ, under prefix.
func yamlFields(typ reflect.Type, prefix string) []string {
	var out []string
	for f := range typ.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		path := prefix + name
		out = append(out, path)
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			if ft.Kind() == reflect.Slice {
				path += "[]"
			}
			ft = ft.Elem()
		}
		// A struct that reads itself from YAML (config.Period) is one setting.
		if ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(reflect.TypeFor[yaml.Unmarshaler]()) {
			out = append(out, yamlFields(ft, path+".")...)
		}
	}
	return out
}

// relativePath is a path that climbs with "../".
var relativePath = regexp.MustCompile(`(?:\.\./)+[A-Za-z0-9_.-][A-Za-z0-9_./-]*`)

// escapesRepo returns the relative paths in file p's content b that leave the repository from
// p's directory and name nothing in it either (a command may run them from a subdirectory, as
// `cd bench && ... ../docs/benchmarks.md` does).
func escapesRepo(p string, b []byte) []string {
	root, _ := filepath.Abs(repoRoot)
	var refs []string
	for _, ref := range relativePath.FindAllString(string(b), -1) {
		ref = strings.TrimRight(ref, ".")
		abs, _ := filepath.Abs(filepath.Join(filepath.Dir(p), ref))
		if abs == root || strings.HasPrefix(abs, root+string(filepath.Separator)) {
			continue
		}
		if _, err := os.Stat(filepath.Join(repoRoot, strings.TrimLeft(ref, "./"))); err == nil {
			continue
		}
		refs = append(refs, ref)
	}
	return refs
}

// readmeStack is what the README's examples run against.
type readmeStack struct {
	dir              string // stands for the repository: bin/, configs/
	apiAddr, simAddr string
	api, worker      *stackProcess // api is the serve process when there is no worker
}

// env is the examples' environment: this process's, without llmq's own variables (the README
// sets what it needs) and without proxies for the local addresses.
func (s *readmeStack) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LLMQ_") {
			env = append(env, kv)
		}
	}
	return append(env, "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost")
}

// startReadmeStack links bin/ (binDir: llmq, api, worker and ctl) into a temporary directory,
// writes configs/local.yaml there (the repository's, on this test's stores and simulator, its key
// files copied) and starts the simulator and llmq: `llmq serve` with serve, else an API and a
// worker process. Everything ends and is removed when the test ends: the processes, the database,
// the private Redis, the directory.
func startReadmeStack(t *testing.T, serve bool) *readmeStack {
	t.Helper()
	s := &readmeStack{dir: t.TempDir()}
	// bin/ is the programs the package's tests share (they only run them).
	require.NoError(t, os.Symlink(binDir(t), filepath.Join(s.dir, "bin")))

	// As `make run` runs it: 20 requests of burst, 10 a second.
	sim := httptest.NewServer(llmsim.New(llmsim.Config{Capacity: 20, RefillPerSecond: 10}))
	t.Cleanup(sim.Close) // after the processes have stopped (cleanups run last first)
	s.simAddr = strings.TrimPrefix(sim.URL, "http://")
	s.writeConfig(t, pgtest.URL(t), redistest.Server(t), sim.URL)

	if serve {
		s.api = startProcess(t, s, "llmq", "serve")
		s.apiAddr = s.api.waitLog(t, "api listening", "addr")
		return s
	}
	s.api = startProcess(t, s, "api")
	s.apiAddr = s.api.waitLog(t, "api listening", "addr")
	s.worker = startProcess(t, s, "worker")
	return s
}

// writeConfig writes the repository's configs/local.yaml into s.dir with the stores and the
// simulator replaced by the test's, the API on a free port and the worker's metrics off, and
// copies the key files it names.
func (s *readmeStack) writeConfig(t *testing.T, dbURL, redisURL, simURL string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "configs", "local.yaml"))
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &cfg))
	cfg["database_url"], cfg["redis_url"] = dbURL, redisURL
	api := cfg["api"].(map[string]any)
	api["listen"] = "127.0.0.1:0"
	// The API-and-worker stack's worker serves its metrics nowhere: the default port (9091),
	// taken by any other worker on the machine, failed the worker's start and the examples.
	worker, _ := cfg["worker"].(map[string]any)
	if worker == nil {
		worker = map[string]any{}
		cfg["worker"] = worker
	}
	worker["metrics_listen"] = "off"
	require.NoError(t, os.MkdirAll(filepath.Join(s.dir, "configs"), 0o700))
	if f, ok := api["stream_secret_file"].(string); ok {
		s.copyRepoFile(t, f)
	}
	for _, c := range cfg["credentials"].([]any) {
		cred := c.(map[string]any)
		require.Regexp(t, `^http://(127\.0\.0\.1|localhost):8090$`, cred["base_url"], "credential %v: the test runs only the simulator", cred["name"])
		cred["base_url"] = simURL
		if f, ok := cred["api_key_file"].(string); ok {
			s.copyRepoFile(t, f)
		}
	}
	out, err := yaml.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(s.dir, "configs", "local.yaml"), out, 0o600))
}

// TestReadme_ComposeStackIsTheLocalStack: the README offers `docker compose up --build` as the
// stack of `make run`, and its examples (the EventSource one needs events_url, the lanes a batch
// lane) assume configs/local.yaml. configs/compose.yaml must say the same apart from where things
// are: the stores' and the simulator's addresses, the listen addresses and the directory of the
// files it names.
func TestReadme_ComposeStackIsTheLocalStack(t *testing.T) {
	t.Parallel()
	load := func(name string) map[string]any {
		t.Helper()
		cfg, err := config.LoadWithoutSecrets(filepath.Join(repoRoot, "configs", name), func(string) string { return "" })
		require.NoError(t, err)
		cfg.DatabaseURL, cfg.RedisURL, cfg.API.Listen, cfg.Worker.MetricsListen = "", "", "", ""
		if cfg.API.StreamSecretFile != "" {
			cfg.API.StreamSecretFile = filepath.Base(cfg.API.StreamSecretFile)
		}
		for i := range cfg.Credentials {
			c := &cfg.Credentials[i]
			c.BaseURL = ""
			if c.APIKeyFile != "" {
				c.APIKeyFile = filepath.Base(c.APIKeyFile)
			}
		}
		// Through YAML: the exported settings, as the file format names them.
		raw, err := yaml.Marshal(cfg)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, yaml.Unmarshal(raw, &m))
		return m
	}
	require.Equal(t, load("local.yaml"), load("compose.yaml"), "configs/compose.yaml departs from configs/local.yaml")
}

// copyRepoFile copies a file the config names (a key), relative to the repository, into s.dir.
func (s *readmeStack) copyRepoFile(t *testing.T, f string) {
	t.Helper()
	require.False(t, filepath.IsAbs(f), "%s: a file inside the repository", f)
	b, err := os.ReadFile(filepath.Join(repoRoot, f))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(s.dir, f), b, 0o600))
}

// stackProcess is one of the stack's programs, its log kept for the test's failure report.
type stackProcess struct {
	name   string
	log    logtest.Buffer
	lines  chan map[string]any // its JSON log lines, while someone waits for one
	exited chan error
}

// startProcess runs bin/NAME --config configs/local.yaml in s.dir until the test ends, when it
// gets SIGTERM (SIGKILL after 15 s).
func startProcess(t *testing.T, s *readmeStack, name string, args ...string) *stackProcess {
	t.Helper()
	p := &stackProcess{name: name, lines: make(chan map[string]any, 64), exited: make(chan error, 1)}
	cmd := exec.Command(filepath.Join(s.dir, "bin", name), append(args, "--config", "configs/local.yaml")...)
	cmd.Dir, cmd.Env = s.dir, s.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.Stdout = &p.log
	require.NoError(t, cmd.Start())
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(io.TeeReader(stderr, &p.log))
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				select {
				case p.lines <- line:
				default: // nobody waits for it
				}
			}
		}
	}()
	go func() {
		<-scanned // Wait closes the pipe: read it to its end first
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.exited:
			require.NoError(t, err, "%s did not stop cleanly:\n%s", name, p.log.String())
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
			t.Errorf("%s did not stop within 15 s of SIGTERM:\n%s", name, p.log.String())
		}
	})
	return p
}

// waitLog waits (60 s at most) for the process's log line whose msg is msg and returns its
// field key.
func (p *stackProcess) waitLog(t *testing.T, msg, key string) string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case line := <-p.lines:
			if line["msg"] == msg {
				return fmt.Sprint(line[key])
			}
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("%s exited (%v) before logging %q:\n%s", p.name, err, msg, p.log.String())
		case <-deadline:
			t.Fatalf("%s did not log %q within 60 s:\n%s", p.name, msg, p.log.String())
		}
	}
}

// TestEscapesRepo: a path that climbs out of the repository to a file the repository lacks is
// reported; one that stays inside, or names a repository file from a subdirectory, is not.
func TestEscapesRepo(t *testing.T) {
	p := filepath.Join(repoRoot, "docs", "guide.md")
	got := escapesRepo(p, []byte("see ../../elsewhere/NOTES.md and ../docs/benchmarks.md, ../api/openapi.yaml; "+
		"cd bench && go run . -write ../docs/benchmarks.md"))
	require.Equal(t, []string{"../../elsewhere/NOTES.md"}, got)
	require.Equal(t, []string{"../other/plan.md"},
		escapesRepo(filepath.Join(repoRoot, "Makefile"), []byte("cd bench && cat ../docs/benchmarks.md ../other/plan.md")))
}

// TestReadme_ComposeStackServesTheTour: the README offers `docker compose up --build` in place of
// `make run`, and its tour then talks to the stack from the host: curl to every local port it
// names (the API, the simulator's fault injection) and bin/ctl on configs/local.yaml, whose
// Postgres and Redis URLs name the host's ports and no password. docker-compose.yml must publish
// each of those ports on the loopback address to the service that serves it, and its Postgres
// must take configs/local.yaml's password-less URL.
func TestReadme_ComposeStackServesTheTour(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	require.NoError(t, err)
	var compose struct {
		Services map[string]struct {
			Command     []string          `yaml:"command"`
			Ports       []string          `yaml:"ports"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &compose))
	published := map[string]string{} // host port → service
	for name, svc := range compose.Services {
		for _, p := range svc.Ports {
			parts := strings.Split(p, ":")
			require.Len(t, parts, 3, "%s: publish %q as 127.0.0.1:<host>:<container>", name, p)
			require.Equal(t, "127.0.0.1", parts[0], "%s: publish %q on the loopback address only", name, p)
			published[parts[1]] = name
		}
	}

	cfg, err := config.LoadWithoutSecrets(filepath.Join(repoRoot, "configs", "local.yaml"), func(string) string { return "" })
	require.NoError(t, err)
	serves := map[string]string{ // the port the tour uses → the service that listens on it
		portOf(t, cfg.API.Listen):  "api",
		portOf(t, cfg.DatabaseURL): "postgres",
		portOf(t, cfg.RedisURL):    "redis",
	}
	for _, c := range cfg.Credentials {
		serves[portOf(t, c.BaseURL)] = "llmsim"
	}
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`(?:localhost|127\.0\.0\.1):(\d+)`).FindAllStringSubmatch(string(readme), -1) {
		_, known := serves[m[1]]
		require.True(t, known, "README uses port %s, which configs/local.yaml does not name", m[1])
	}
	for port, svc := range serves {
		require.Equal(t, svc, published[port], "docker-compose.yml: port %s (%s) is not published", port, svc)
	}

	pg := compose.Services["postgres"].Environment
	dbURL, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	if pw, ok := dbURL.User.Password(); ok {
		require.Equal(t, pg["POSTGRES_PASSWORD"], pw, "compose's Postgres password is not configs/local.yaml's")
	} else {
		require.Equal(t, "trust", pg["POSTGRES_HOST_AUTH_METHOD"],
			"configs/local.yaml connects without a password: compose's Postgres must trust it")
	}
	require.Equal(t, strings.TrimPrefix(dbURL.Path, "/"), pg["POSTGRES_DB"], "compose's database is not configs/local.yaml's")
}

// portOf returns the port of a listen address or a URL.
func portOf(t *testing.T, addr string) string {
	t.Helper()
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		return u.Port()
	}
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, "%q", addr)
	return port
}
