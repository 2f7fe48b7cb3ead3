package main

// The status page in a real browser: headless Chromium (Debian's
// chromium, driven by go-rod over the DevTools protocol) opens alpha's
// page of the demo once and never reloads it. The page must follow the
// cluster live, through its own stream: beta disconnected shows StandAlone
// within 3 s with a warning naming the fix, then the reconnect shows the
// resync and UpToDate, and the disconnect is listed under recent events.
// Every request the page makes goes to alpha's control address.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-rod/rod"
	"github.com/go-rod/rod/lib/launcher"
	"github.com/go-rod/rod/lib/proto"
)

// pageWait bounds each wait for the page to show something.
const pageWait = 3 * time.Second

// pageWidth is the browser window's width: a laptop's screen, where the
// page must fit without scrolling sideways.
const pageWidth = 1280

func TestE2EStatusPage(t *testing.T) {
	e2e(t)
	chromium := RequireTool(t, "chromium", "chromium")
	d := startDemo(t)
	control := d.nodes["alpha"].Control
	pageURL := "http://" + control + "/"

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bp := openBrowserPage(t, ctx, chromium)

	var mu sync.Mutex
	var requests []*proto.NetworkRequestWillBeSent
	var exceptions []string
	go bp.page.EachEvent(func(e *proto.NetworkRequestWillBeSent) {
		mu.Lock()
		defer mu.Unlock()
		requests = append(requests, e)
	}, func(e *proto.RuntimeExceptionThrown) {
		mu.Lock()
		defer mu.Unlock()
		what := e.ExceptionDetails.Text
		if x := e.ExceptionDetails.Exception; x != nil {
			what += " " + x.Description
		}
		exceptions = append(exceptions, what)
	})()
	// Whatever the Content-Security-Policy refuses (an inline style, a
	// script from elsewhere) is recorded from the first byte on.
	if _, err := bp.page.EvalOnNewDocument(`window.replvolRefused = [];
		document.addEventListener("securitypolicyviolation", (e) => window.replvolRefused.push(e.violatedDirective + " " + e.blockedURI));`); err != nil {
		t.Fatalf("install the CSP listener: %v", err)
	}

	if err := bp.page.Navigate(pageURL); err != nil {
		t.Fatalf("open %s: %v", pageURL, err)
	}
	if err := bp.page.WaitLoad(); err != nil {
		t.Fatalf("load %s: %v", pageURL, err)
	}
	// A reload would lose this.
	bp.eval(`() => { window.replvolOpenedOnce = true }`)
	bp.waitText("live", 10*time.Second, equals("live"))
	bp.waitText("replica-vol0-beta-replication", pageWait, equals("Connected"))
	bp.waitText("replica-vol0-beta-disk", pageWait, equals("UpToDate"))
	bp.waitText("vol-vol0-primary", pageWait, equals("alpha"))
	bp.waitPresent("warnings-none", pageWait)

	// beta disconnected: StandAlone and the warning with its fix, in 3 s.
	began := time.Now()
	d.mustCtl("alpha", "disconnect", volName, "--node", "beta")
	deadline := began.Add(pageWait)
	bp.waitText("replica-vol0-beta-replication", time.Until(deadline), equals("StandAlone"))
	fix := "replctl connect vol0 --node beta"
	bp.waitText("warning-standalone-vol0-beta-command", time.Until(deadline), equals(fix))
	t.Logf("beta StandAlone and the warning %q on the page %s after the disconnect began", fix, time.Since(began).Round(time.Millisecond))
	// The same warning, with its fix, for scripts: status --check exits
	// 4, and the JSON of replctl status and of /api/status holds it.
	if r := d.ctl("alpha", "status", "--check"); r.code != exitWarning || !strings.Contains(r.out, "fix: "+fix) {
		t.Errorf("replctl status --check with beta StandAlone: exit %d, want %d and the fix:\n%s", r.code, exitWarning, r.out)
	}
	for what, js := range map[string]string{"replctl status --json": d.mustCtl("alpha", "status", "--json"), "/api/status": httpGet(t, "http://"+control+"/api/status")} {
		var doc struct {
			Warnings []struct{ ID, Kind, Severity, Command string } `json:"warnings"`
		}
		if err := json.Unmarshal([]byte(js), &doc); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, js)
		}
		if len(doc.Warnings) != 1 || doc.Warnings[0].ID != "warning-standalone-vol0-beta" || doc.Warnings[0].Severity != "warning" || doc.Warnings[0].Command != fix {
			t.Errorf("%s warnings %+v, want beta's StandAlone with %q", what, doc.Warnings, fix)
		}
	}

	// Writes while beta is away, for a resync long enough to watch; the
	// sparklines show them.
	writing := time.Now()
	qemuIO(t, d.uri, "write -P 0xab 0 192M")
	written := 192 << 20
	wrote := time.Since(writing)
	bp.waitText("vol-vol0-throughput", 10*time.Second, func(s string) bool {
		return !strings.Contains(s, "max —") && !strings.Contains(s, "max 0 B/s")
	})
	t.Logf("wrote %d MiB on alpha in %s; throughput sparkline: %q", written>>20, wrote.Round(time.Millisecond), bp.text("vol-vol0-throughput"))

	// Record every state the resync bar shows from now on.
	bp.eval(`() => {
		window.replvolBars = [];
		const note = () => {
			const p = document.getElementById("replica-vol0-beta-resync-percent");
			if (p) window.replvolBars.push(p.textContent);
		};
		new MutationObserver(note).observe(document.body, {subtree: true, childList: true});
	}`)
	reconnect := time.Now()
	d.mustCtl("alpha", "connect", volName, "--node", "beta")
	t.Logf("replctl connect returned after %s", time.Since(reconnect).Round(time.Millisecond))
	bp.waitText("replica-vol0-beta-disk", syncTimeout, equals("UpToDate"))
	bp.waitText("replica-vol0-beta-replication", pageWait, equals("Connected"))
	bp.waitGone("warning-standalone-vol0-beta", pageWait)
	if r := d.ctl("alpha", "status", "--check"); r.code != 0 || !strings.Contains(r.out, "warnings: none") {
		t.Errorf("replctl status --check in sync again: exit %d, want 0:\n%s", r.code, r.out)
	}
	bars := bp.eval(`() => window.replvolBars`).Value.Arr()
	var seen []string
	for _, b := range bars {
		seen = append(seen, b.Str())
	}
	resyncSecs := resyncSeconds(t, d)
	switch {
	case len(seen) > 0:
		t.Logf("resync bar seen %d times (%s ... %s); resync took %.1fs, UpToDate on the page %s after connect",
			len(seen), seen[0], seen[len(seen)-1], resyncSecs, time.Since(reconnect).Round(time.Millisecond))
	case resyncSecs >= 1.5:
		t.Errorf("the page never showed beta's resync bar during a %.1fs resync", resyncSecs)
	default:
		t.Logf("resync of %.1fs too fast for the page to show a bar: went straight to UpToDate", resyncSecs)
	}

	// The disconnect is under recent events (beta's own history).
	events := bp.waitSelector(`#events li[data-kind="disconnected"]`, pageWait)
	if !strings.Contains(events, "beta") {
		t.Errorf("the disconnect event does not name beta: %q", events)
	}
	t.Logf("recent events list the disconnect: %q", events)
	bp.checkEventsSeparateMessageAndChange()

	if !bp.eval(`() => window.replvolOpenedOnce === true`).Value.Bool() {
		t.Errorf("the page was reloaded")
	}
	switch refused := bp.eval(`() => window.replvolRefused`).Value; {
	case refused.Nil():
		t.Errorf("the CSP listener was not installed before the page loaded")
	case len(refused.Arr()) > 0:
		t.Errorf("the Content-Security-Policy refused %v", refused.Arr())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(exceptions) > 0 {
		t.Errorf("the page's script threw: %v", exceptions)
	}
	documents := 0
	for _, r := range requests {
		u, err := url.Parse(r.Request.URL)
		if err != nil || u.Scheme != "http" || u.Host != control {
			t.Errorf("the page requested %s (%s): want only http://%s", r.Request.URL, r.Type, control)
		}
		if r.Type == proto.NetworkResourceTypeDocument {
			documents++
		}
	}
	if documents != 1 {
		t.Errorf("the page loaded %d documents, want 1 (never reloaded)", documents)
	}
	t.Logf("%d requests, all to %s", len(requests), control)
	bp.screenshot("status-page")
}

// TestE2EStatusPageThroughAFailover: alpha, beta and a witness as
// replnode processes; Chromium opens beta's page once and follows it:
//
//   - alpha, the primary, is killed: the page shows "vol0 failed over
//     alpha → beta at T" and a WARNING that alpha is down, painted amber,
//     with the volume's replica table on the first screen (1000 px);
//     replctl status --check exits 4 and its JSON holds the warning;
//   - the witness is killed too: no quorum, a CRITICAL painted red, not
//     like the WARNING (page.css's .warning.warning painted both amber);
//     replctl status --check exits 5;
//   - beta, the page's own node, is killed: the page says it lost contact
//     with beta and since when, and greys out what it shows.
func TestE2EStatusPageThroughAFailover(t *testing.T) {
	e2e(t)
	chromium := RequireTool(t, "chromium", "chromium")
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, Size: 32 << 20})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	pageURL := "http://" + c.nodes["beta"].Control + "/"

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bp := openBrowserPage(t, ctx, chromium)
	var mu sync.Mutex
	var exceptions []string
	go bp.page.EachEvent(func(e *proto.RuntimeExceptionThrown) {
		mu.Lock()
		defer mu.Unlock()
		exceptions = append(exceptions, e.ExceptionDetails.Text)
	})()
	if err := bp.page.Navigate(pageURL); err != nil {
		t.Fatalf("open %s: %v", pageURL, err)
	}
	if err := bp.page.WaitLoad(); err != nil {
		t.Fatalf("load %s: %v", pageURL, err)
	}
	bp.eval(`() => { window.replvolOpenedOnce = true }`)
	bp.waitText("live", 10*time.Second, equals("live"))
	bp.waitText("vol-vol0-primary", pageWait, equals("alpha"))
	bp.waitPresent("warnings-none", pageWait)
	if bp.text("contact") != "" || bp.eval(`() => document.getElementById("contact").hidden`).Value.Bool() != true {
		t.Errorf("a live page shows the lost-contact banner: %q", bp.text("contact"))
	}
	// Every text the volume's no-primary warning shows, for the log.
	bp.eval(`() => {
		window.replvolNoPrimary = [];
		new MutationObserver(() => {
			const w = document.getElementById("warning-no-primary-vol0");
			if (w) window.replvolNoPrimary.push(w.textContent.replace(/\s+/g, " ").trim());
		}).observe(document.body, {subtree: true, childList: true});
	}`)

	// alpha, the primary, dies: beta takes over and the page says so.
	killed := time.Now()
	c.kill("alpha")
	line := bp.waitText("vol-vol0-failover", 30*time.Second, func(s string) bool { return strings.HasPrefix(s, "vol0 failed over alpha → beta at ") })
	t.Logf("%s after the kill, the page says: %q", time.Since(killed).Round(time.Millisecond), line)
	bp.waitText("vol-vol0-primary", pageWait, equals("beta"))
	bp.waitText("warning-node-down-alpha-text", pageWait, func(s string) bool { return strings.Contains(s, "Node alpha is unreachable") })
	for _, seen := range bp.eval(`() => window.replvolNoPrimary`).Value.Arr() {
		t.Logf("while beta took over, the page said: %q", seen.Str())
	}
	// Three nodes, one of them with its error, at 1280 px: the node
	// table fits, its last column (NBD) in view, and the page does not
	// scroll sideways.
	bp.waitPresent("node-alpha-error", pageWait)
	bp.checkFitsTheWindow("table.nodes", "#node-beta td:last-child")
	amber := map[string]string{"backgroundColor": "rgb(255, 244, 214)", "borderLeftColor": "rgb(154, 103, 0)"}
	bp.checkStyle("warning-node-down-alpha", amber)
	bp.checkStyle("warning-node-down-alpha .sev", map[string]string{"color": "rgb(154, 103, 0)"})
	if cls := bp.eval(`() => document.getElementById("vol-vol0").className`).Value.Str(); cls != "volume warning" {
		t.Errorf("vol0's section has classes %q, want volume warning", cls)
	}
	// The problem volume's replica table is on the first screen.
	if bottom, height := bp.eval(`() => document.getElementById("replica-vol0-alpha").getBoundingClientRect().bottom`).Value.Num(),
		bp.eval(`() => window.innerHeight`).Value.Num(); bottom > height {
		t.Errorf("alpha's replica row ends at %.0f px, below the first %.0f px", bottom, height)
	}
	r := c.ctl("beta", "status", "--check")
	if r.code != exitWarning || !strings.Contains(r.out, "fix: systemctl start replnode  (on alpha)") || !strings.Contains(r.out, "failed over alpha → beta") {
		t.Errorf("replctl status --check with alpha down: exit %d, want %d, the fix and the failover:\n%s", r.code, exitWarning, r.out)
	}
	var doc struct {
		Volumes []struct {
			LastFailover *struct{ From, To string } `json:"last_failover"`
		} `json:"volumes"`
		Warnings []struct{ ID, Severity, Command, Where string } `json:"warnings"`
	}
	js := c.mustCtl("beta", "status", "--json")
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		t.Fatalf("status --json: %v\n%s", err, js)
	}
	if len(doc.Volumes) != 1 || doc.Volumes[0].LastFailover == nil || doc.Volumes[0].LastFailover.From != "alpha" || doc.Volumes[0].LastFailover.To != "beta" {
		t.Errorf("status --json: no last_failover alpha → beta:\n%s", js)
	}
	if !slices.ContainsFunc(doc.Warnings, func(w struct{ ID, Severity, Command, Where string }) bool {
		return w.ID == "warning-node-down-alpha" && w.Severity == "warning" && w.Command == "systemctl start replnode" && w.Where == "on alpha"
	}) {
		t.Errorf("status --json: no warning that alpha is down, with its fix:\n%s", js)
	}

	// The witness dies too: no quorum, a CRITICAL, painted red.
	c.kill(witnessName)
	bp.waitPresent("warning-no-quorum", 30*time.Second)
	red := map[string]string{"backgroundColor": "rgb(253, 236, 234)", "borderLeftColor": "rgb(192, 54, 44)"}
	bp.checkStyle("warning-no-quorum", red)
	bp.checkStyle("warning-no-quorum .sev", map[string]string{"color": "rgb(192, 54, 44)"})
	bp.checkStyle("warning-node-down-alpha", amber)
	if r := c.ctl("beta", "status", "--check"); r.code != exitCritical || !strings.Contains(r.out, "CRITICAL No raft quorum") {
		t.Errorf("replctl status --check without a quorum: exit %d, want %d:\n%s", r.code, exitCritical, r.out)
	}
	bp.screenshot("status-page-no-quorum")

	// beta, the page's own node, dies: the page says so and greys out.
	before := time.Now()
	c.kill("beta")
	banner := bp.waitText("contact", 10*time.Second, func(s string) bool { return strings.HasPrefix(s, "Lost contact with beta since ") })
	t.Logf("%s after beta was killed the page says: %q", time.Since(before).Round(time.Millisecond), banner)
	if !bp.eval(`() => document.body.classList.contains("stale")`).Value.Bool() {
		t.Errorf("the page of a dead node is not marked stale")
	}
	bp.checkStyle("main", map[string]string{"opacity": "0.5", "filter": "grayscale(1)"})
	bp.screenshot("status-page-lost-contact")

	if !bp.eval(`() => window.replvolOpenedOnce === true`).Value.Bool() {
		t.Errorf("the page was reloaded")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(exceptions) > 0 {
		t.Errorf("the page's script threw: %v", exceptions)
	}
}

// httpGet returns the body of a GET that must answer 200.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	hc := http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v\n%s", url, resp.Status, err, body)
	}
	return string(body)
}

// checkStyle checks computed style properties of the element a selector
// (an element id, or an id and a descendant selector) finds.
func (bp *browserPage) checkStyle(selector string, want map[string]string) {
	bp.t.Helper()
	css := "#" + selector
	if selector == "main" {
		css = selector
	}
	for prop, value := range want {
		got := bp.eval(`(s, p) => { const e = document.querySelector(s); return e ? getComputedStyle(e)[p] : null }`, css, prop).Value
		if got.Nil() {
			bp.t.Errorf("no element %s", css)
			return
		}
		if got.Str() != value {
			bp.t.Errorf("%s: %s is %q, want %q", css, prop, got.Str(), value)
		}
	}
}

// checkFitsTheWindow checks that the page does not scroll sideways, that
// the element table (a CSS selector) shows all its width (no overflow:
// its scrollWidth is its clientWidth) and ends inside the window, and
// that the element last (a cell of its last column) is in view.
func (bp *browserPage) checkFitsTheWindow(table, last string) {
	bp.t.Helper()
	m := bp.eval(`(table, last) => {
		const t = document.querySelector(table), c = document.querySelector(last), d = document.documentElement;
		if (!t || !c) return null;
		return {pageScroll: d.scrollWidth, pageClient: d.clientWidth, tableScroll: t.scrollWidth, tableClient: t.clientWidth,
			tableRight: t.getBoundingClientRect().right, lastRight: c.getBoundingClientRect().right, window: window.innerWidth};
	}`, table, last).Value
	if m.Nil() {
		bp.t.Fatalf("no %s or no %s on the page", table, last)
	}
	num := func(k string) float64 { return m.Get(k).Num() }
	if num("pageScroll") > num("pageClient") {
		bp.t.Errorf("the page scrolls sideways at %.0f px: %.0f px wide", num("window"), num("pageScroll"))
	}
	if num("tableScroll") > num("tableClient") {
		bp.t.Errorf("%s overflows: %.0f px of content in %.0f px", table, num("tableScroll"), num("tableClient"))
	}
	if num("tableRight") > num("window") || num("lastRight") > num("window") {
		bp.t.Errorf("%s ends at %.0f px and %s at %.0f px, past the %.0f px window", table, num("tableRight"), last, num("lastRight"), num("window"))
	}
	bp.screenshot("fits-the-window")
}

// checkEventsSeparateMessageAndChange checks that each recent event with
// a state change shows its message and the change as two elements, set
// apart: a gap of a few pixels on one line (or the change on a line of
// its own), the change in a box of its own.
func (bp *browserPage) checkEventsSeparateMessageAndChange() {
	bp.t.Helper()
	res := bp.eval(`() => {
		const out = [];
		for (const li of document.querySelectorAll("#events li.event")) {
			const c = li.querySelector(".change");
			if (!c) continue;
			const m = li.querySelector(".msg");
			if (!m || m.contains(c) || c.contains(m)) { out.push({id: li.id, apart: false, why: "not two elements"}); continue; }
			const mr = m.getBoundingClientRect(), cr = c.getBoundingClientRect(), s = getComputedStyle(c);
			const gap = cr.top >= mr.bottom - 1 ? 99 : cr.left - mr.right;
			const boxed = s.borderLeftStyle !== "none" && parseFloat(s.borderLeftWidth) > 0;
			out.push({id: li.id, apart: gap >= 6 && boxed, why: "gap " + gap.toFixed(1) + " px, boxed " + boxed});
		}
		return out;
	}`).Value.Arr()
	if len(res) == 0 {
		bp.t.Errorf("no recent event with a state change on the page")
	}
	for _, r := range res {
		if !r.Get("apart").Bool() {
			bp.t.Errorf("event %s runs its message into its state change: %s", r.Get("id").Str(), r.Get("why").Str())
		}
	}
}

// browserPage is one page of a headless Chromium.
type browserPage struct {
	t    *testing.T
	page *rod.Page
	// artifacts is where screenshots go: kept when the test fails (their
	// paths are in its log), or when REPLVOL_KEEP_SCREENSHOTS is set;
	// removed when it passes.
	artifacts string
}

// openBrowserPage launches the system's Chromium (never a downloaded one)
// with a fresh profile and opens a blank page; cleanups close both.
func openBrowserPage(t *testing.T, ctx context.Context, bin string) *browserPage {
	t.Helper()
	profile, err := os.MkdirTemp("", "replvol-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	l := launcher.New().Context(ctx).Bin(bin).
		Headless(true).NoSandbox(true).UserDataDir(profile).
		Set("disable-gpu").Set("disable-background-networking").Set("disable-component-update").
		Set("no-first-run").Set("disable-sync")
	controlURL, err := l.Launch()
	if err != nil {
		os.RemoveAll(profile)
		t.Fatalf("launch %s: %v", bin, err)
	}
	t.Cleanup(func() {
		l.Kill()
		l.Cleanup() // waits for the browser to exit, removes the profile
	})
	browser := rod.New().Context(ctx).ControlURL(controlURL)
	if err := browser.Connect(); err != nil {
		t.Fatalf("connect to %s: %v", bin, err)
	}
	t.Cleanup(func() { _ = browser.Close() })
	page, err := browser.Page(proto.TargetCreateTarget{URL: "about:blank"})
	if err != nil {
		t.Fatalf("open a page: %v", err)
	}
	if err := (proto.EmulationSetDeviceMetricsOverride{Width: pageWidth, Height: 1000, DeviceScaleFactor: 1}).Call(page); err != nil {
		t.Fatalf("set the window size: %v", err)
	}
	artifacts, err := os.MkdirTemp("", "replvol-page-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	bp := &browserPage{t: t, page: page, artifacts: artifacts}
	t.Cleanup(func() {
		switch {
		case t.Failed():
			bp.screenshot("failed")
		case os.Getenv("REPLVOL_KEEP_SCREENSHOTS") == "":
			_ = os.RemoveAll(artifacts)
		}
	})
	return bp
}

// eval runs a JavaScript function on the page; its value is the
// result's Value.
func (bp *browserPage) eval(js string, args ...any) *proto.RuntimeRemoteObject {
	bp.t.Helper()
	res, err := bp.page.Eval(js, args...)
	if err != nil {
		bp.t.Fatalf("eval %s: %v", js, err)
	}
	return res
}

const textByID = `(id) => { const e = document.getElementById(id); return e ? e.textContent.replace(/\s+/g, " ").trim() : null }`

// text is the element's text now ("" when there is none).
func (bp *browserPage) text(id string) string {
	bp.t.Helper()
	return bp.eval(textByID, id).Value.Str()
}

func equals(want string) func(string) bool { return func(s string) bool { return s == want } }

// waitText waits until the element with id exists and its text satisfies
// cond, polling the live page (never reloading it).
func (bp *browserPage) waitText(id string, timeout time.Duration, cond func(string) bool) string {
	bp.t.Helper()
	return bp.poll(fmt.Sprintf("#%s", id), timeout, func() (string, bool) {
		v := bp.eval(textByID, id).Value
		return v.Str(), !v.Nil() && cond(v.Str())
	})
}

// waitSelector waits for an element matching a CSS selector; its text.
func (bp *browserPage) waitSelector(selector string, timeout time.Duration) string {
	bp.t.Helper()
	js := `(s) => { const e = document.querySelector(s); return e ? e.textContent.replace(/\s+/g, " ").trim() : null }`
	return bp.poll(selector, timeout, func() (string, bool) {
		v := bp.eval(js, selector).Value
		return v.Str(), !v.Nil()
	})
}

func (bp *browserPage) waitPresent(id string, timeout time.Duration) {
	bp.t.Helper()
	bp.waitText(id, timeout, func(string) bool { return true })
}

func (bp *browserPage) waitGone(id string, timeout time.Duration) {
	bp.t.Helper()
	bp.poll("no #"+id, timeout, func() (string, bool) {
		v := bp.eval(textByID, id).Value
		return v.Str(), v.Nil()
	})
}

func (bp *browserPage) poll(what string, timeout time.Duration, check func() (string, bool)) string {
	bp.t.Helper()
	var got string
	if !within(max(timeout, 0), 50*time.Millisecond, func() bool {
		var ok bool
		got, ok = check()
		return ok
	}) {
		bp.t.Fatalf("the page did not show %s within %s (last: %q)", what, timeout.Round(time.Millisecond), got)
	}
	return got
}

// screenshot saves the whole page as a PNG artifact and logs its path.
func (bp *browserPage) screenshot(name string) {
	bp.t.Helper()
	png, err := bp.page.Screenshot(true, &proto.PageCaptureScreenshot{Format: proto.PageCaptureScreenshotFormatPng})
	if err != nil {
		bp.t.Logf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(bp.artifacts, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		bp.t.Logf("screenshot %s: %v", name, err)
		return
	}
	bp.t.Logf("screenshot of the page: %s", path)
}

var resyncDone = regexp.MustCompile(`resync to beta finished: \S+ in ([0-9.]+)s`)

// resyncSeconds is how long alpha's last resync to beta took, from its
// events (0 when none is recorded).
func resyncSeconds(t *testing.T, d *demo) float64 {
	t.Helper()
	out := d.mustCtl("alpha", "status", "--events", "20")
	m := resyncDone.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0
	}
	secs, _ := strconv.ParseFloat(m[len(m)-1][1], 64)
	return secs
}

// TestE2EStatusPageShowsTheScrubAndUnrecoverableBlocks: the page, open
// once, follows a scrub of beta (its bar and ETA, "paused", gone once
// stopped); once a block is bad on both replicas it shows the CRITICAL
// unrecoverable for each, with where the ranges are named, and status
// --check exits 5; a write to the block clears both.
func TestE2EStatusPageShowsTheScrubAndUnrecoverableBlocks(t *testing.T) {
	e2e(t)
	chromium := RequireTool(t, "chromium", "chromium")
	RequireTool(t, "qemu-io", "qemu-utils")
	d := startDemo(t)
	d.waitInSync("alpha")
	qemuIO(t, d.uri, "write -P 0x5a 0 8M", "flush")
	d.waitInSync("alpha")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bp := openBrowserPage(t, ctx, chromium)
	pageURL := "http://" + d.nodes["alpha"].Control + "/"
	if err := bp.page.Navigate(pageURL); err != nil {
		t.Fatalf("open %s: %v", pageURL, err)
	}
	if err := bp.page.WaitLoad(); err != nil {
		t.Fatalf("load %s: %v", pageURL, err)
	}
	bp.waitText("live", 10*time.Second, equals("live"))
	bp.waitPresent("warnings-none", pageWait)

	// A scrub of beta slow enough to watch: 1 MiB/s over the volume.
	d.mustCtl("alpha", "scrub", volName, "--node", "beta", "--rate", "1MiB")
	bp.waitText("replica-vol0-beta-scrub-eta", pageWait, func(s string) bool { return s != "—" && s != "paused" })
	bp.waitText("replica-vol0-beta-scrub-percent", pageWait, func(s string) bool { return strings.HasSuffix(s, "%") })
	if v := bp.eval(textByID, "replica-vol0-alpha-scrub").Value; !v.Nil() {
		t.Errorf("alpha, which does not scrub, shows a scrub bar: %q", v.Str())
	}
	d.mustCtl("alpha", "scrub", volName, "--node", "beta", "--pause")
	bp.waitText("replica-vol0-beta-scrub-eta", pageWait, equals("paused"))
	d.mustCtl("alpha", "scrub", volName, "--node", "beta", "--stop")
	bp.waitGone("replica-vol0-beta-scrub", pageWait)

	// Block 1000 bad on both replicas: a scrub finds it on both.
	flipBlocks(t, d.disk("alpha"), []int64{1000})
	flipBlocks(t, d.disk("beta"), []int64{1000})
	r := runCmd(3*time.Minute, nil, replctlBin, d.ctlArgs("alpha", []string{"scrub", volName, "--wait", "--rate", "256MiB"})...)
	if r.code != exitUnrecoverable {
		t.Fatalf("replctl scrub vol0 --wait with a block bad on both replicas: %s; want exit %d", r, exitUnrecoverable)
	}
	for _, node := range []string{"alpha", "beta"} {
		id := "warning-unrecoverable-vol0-" + node
		bp.waitText(id+"-command", pageWait, equals("replctl events --node "+node))
		bp.waitText(id+"-text", pageWait, func(s string) bool { return strings.HasPrefix(s, "1 blocks of vol0 on "+node+" are bad") })
		if class := bp.eval(`(id) => document.getElementById(id).className`, id).Value.Str(); !strings.Contains(class, "critical") {
			t.Errorf("#%s has classes %q, want critical", id, class)
		}
		bp.waitText("replica-vol0-"+node+"-unrecoverable", pageWait, equals("1 blocks unrecoverable"))
	}
	if r := d.ctl("alpha", "status", "--check"); r.code != exitCritical || !strings.Contains(r.out, "no replica holds a good copy") {
		t.Errorf("replctl status --check with a block bad on both: exit %d, want %d:\n%s", r.code, exitCritical, r.out)
	}

	qemuIO(t, d.uri, "write -P 0x33 4096000 4096", "flush")
	bp.waitGone("warning-unrecoverable-vol0-alpha", pageWait)
	bp.waitGone("warning-unrecoverable-vol0-beta", pageWait)
	bp.waitPresent("warnings-none", pageWait)
}
