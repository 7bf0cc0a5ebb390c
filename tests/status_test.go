package tests

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/syncmgr/syncmgr/proxy"
)

// A label is chosen by the client: one with a newline, terminal escapes and a
// bidi override must not reach the operator's terminal raw, nor fake a line.
func TestStatusEscapesClientLabels(t *testing.T) {
	d := startDaemon(t)
	forged := "worker\n2        999   1      0      root\x1b]0;owned\x07\x1b[2J\u202egnp.exe\tx"
	c := d.dial(t, proxy.WithLabel(forged))
	call(t, c, "create", obj("lock", "ingest"))
	out, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+d.key), "status", "--address", d.sock)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, bad := range []string{"\x1b", "\x07", "\u202e", "\t"} {
		if strings.Contains(out, bad) {
			t.Errorf("status printed %q raw:\n%s", bad, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "2        999") {
			t.Errorf("a forged session line reached the output: %q", line)
		}
	}
	if !strings.Contains(out, `"worker\n2`) || !strings.Contains(out, `\x1b]0;owned\a\x1b[2J\u202egnp.exe\tx"`) {
		t.Errorf("the label is not shown escaped:\n%s", out)
	}

	// --json carries the label exactly (JSON escapes it); the document parses.
	out, stderr, code = runCmd(t, env("SYNCMGR_AUTHKEY="+d.key), "status", "--json", "--address", d.sock)
	if code != 0 {
		t.Fatalf("--json: exit %d: %s", code, stderr)
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("--json printed an escape raw")
	}
	var st struct {
		Server struct {
			Version  string `json:"version"`
			Sessions int    `json:"sessions"`
			Objects  int    `json:"objects"`
		} `json:"server"`
		Objects []struct {
			Kind, Name, State string
		} `json:"objects"`
		Sessions []struct {
			ID    int    `json:"id"`
			Label string `json:"label"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, out)
	}
	if st.Server.Version != "0.1.0" || st.Server.Objects != 1 || len(st.Objects) != 1 || st.Objects[0].Name != "ingest" {
		t.Errorf("--json: %+v", st)
	}
	labels := map[string]bool{}
	for _, s := range st.Sessions {
		labels[s.Label] = true
	}
	if !labels[forged] || !labels["syncmgr status"] {
		t.Errorf("--json sessions %+v lack the forged label verbatim and the status client", st.Sessions)
	}
}

func TestStatusReadableSizesAndUsage(t *testing.T) {
	d := startDaemon(t)
	out, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+d.key), "status", "--address", d.sock)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, " MiB") {
		t.Errorf("rss is not shown in readable units:\n%s", out)
	}
	if _, stderr, code := runCmd(t, env("SYNCMGR_AUTHKEY="+d.key), "status", "--address", d.sock, "extra"); code != 2 ||
		!strings.Contains(stderr, `unexpected argument "extra"`) {
		t.Errorf("status with an extra argument: exit %d, %q", code, stderr)
	}
}
