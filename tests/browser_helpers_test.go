package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// chromiumPath is Debian's Chromium, which `make tools` installs.
const chromiumPath = "/usr/bin/chromium"

// browser is one headless Chromium tab on the Temporal Web UI at ui.
type browser struct {
	t   *testing.T
	ctx context.Context
	ui  string
	n   int // Screenshots taken.
	dir string
}

// newBrowser launches headless Chromium with a fresh profile and the flags
// that keep it off the (closed) network, and closes it when the test ends.
// It fails the test, saying how to install it, when Chromium is missing.
func newBrowser(t *testing.T, ui string) *browser {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		require.FailNowf(t, "Chromium is missing", "the browser test drives %s: run `make tools` "+
			"(it runs `apt-get install -y chromium`): %v", chromiumPath, err)
	}
	shots, err := os.MkdirTemp("", "keyed-browser-")
	require.NoError(t, err)
	t.Cleanup(func() { // Kept when the test fails, for its screenshots.
		if !t.Failed() {
			_ = os.RemoveAll(shots)
		}
	})
	profile := t.TempDir()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(profile),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("disable-extensions", true),
		chromedp.WindowSize(1440, 1000))
	ctx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	b := &browser{t: t, ctx: ctx, ui: strings.TrimRight(ui, "/"), dir: shots}
	t.Cleanup(func() {
		if t.Failed() {
			b.screenshot("failed")
		}
	})
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "start %s", chromiumPath)
	return b
}

// open navigates to path under the Web UI.
func (b *browser) open(path string) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.ctx, chromedp.Navigate(b.ui+path)), "open %s", path)
}

// openQuery opens the workflow list filtered by the visibility query q.
func (b *browser) openQuery(q string) {
	b.t.Helper()
	b.open("/namespaces/default/workflows?query=" + url.QueryEscape(q))
}

// waitText waits until the page's text contains every one of texts.
func (b *browser) waitText(timeout time.Duration, texts ...string) {
	b.t.Helper()
	quoted, err := json.Marshal(texts)
	require.NoError(b.t, err)
	expr := fmt.Sprintf(`(() => { const text = %s; return %s.every(s => text.includes(s)); })()`, pageText, quoted)
	if err := b.until(timeout, expr); err != nil {
		b.screenshot("wait-text")
		require.FailNowf(b.t, "text not shown", "waiting for %q on %s: %v; the page shows:\n%s", texts, b.url(), err, b.text())
	}
}

// click clicks the first visible button, link, tab or menu item whose text
// is label, waiting up to timeout for it to appear.
func (b *browser) click(timeout time.Duration, label string) {
	b.t.Helper()
	quoted, err := json.Marshal(label)
	require.NoError(b.t, err)
	expr := fmt.Sprintf(`(() => {
	const want = %s;
	const els = [...document.querySelectorAll('button, a, [role=tab], [role=menuitem], [role=option], li, label')];
	const el = els.find(e => e.offsetParent !== null && e.innerText && e.innerText.trim() === want && !e.disabled);
	if (!el) return false;
	el.scrollIntoView({block: 'center'});
	el.click();
	return true;
})()`, quoted)
	if err := b.until(timeout, expr); err != nil {
		b.screenshot("click")
		require.FailNowf(b.t, "nothing to click", "no %q to click on %s: %v; the page shows:\n%s", label, b.url(), err, b.text())
	}
}

// mouseClick clicks, with the mouse, the first visible element sel
// selects (a chromedp.CSS or chromedp.JSPath), waiting up to timeout.
func mouseClick[S chromedp.CSS | chromedp.JSPath](b *browser, timeout time.Duration, sel S) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Click(sel, chromedp.NodeVisible)); err != nil {
		b.screenshot("click")
		require.FailNowf(b.t, "nothing to click", "no %s to click on %s: %v", sel, b.url(), err)
	}
}

// selectUpdate picks name in the Name menu of the update dialog modal (a
// CSS selector), opening the menu with the mouse and clicking the option,
// again until the menu's input shows name: the menu ignores a click while
// it is still opening.
func (b *browser) selectUpdate(modal, name string) {
	b.t.Helper()
	chosen := fmt.Sprintf(`document.querySelector(%q).value === %q`, modal+" [data-testid=update-select]", name)
	for range 5 {
		mouseClick(b, 10*time.Second, chromedp.CSS(modal+" button[aria-haspopup]"))
		time.Sleep(300 * time.Millisecond)
		mouseClick(b, 10*time.Second, chromedp.JSPath(fmt.Sprintf(
			`[...document.querySelectorAll(%q)].filter(e => e.textContent.trim() === %q)`, modal+" [role=option]", name)))
		if b.until(2*time.Second, chosen) == nil {
			return
		}
	}
	b.screenshot("select")
	require.FailNowf(b.t, "update not selected", "the Name menu of %s does not show %q", modal, name)
}

// insertText clicks the editable element sel selects and inserts text as
// typed input, so that an editor's auto-closing of brackets and quotes does
// not apply.
func (b *browser) insertText(timeout time.Duration, sel chromedp.CSS, text string) {
	b.t.Helper()
	mouseClick(b, timeout, sel)
	err := chromedp.Do(b.ctx, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: text})
		return err
	}))
	require.NoError(b.t, err, "insert text into %s", sel)
}

// until evaluates the JavaScript predicate expr every 200ms until it is
// true or timeout passes. Errors while the page navigates are retried.
func (b *browser) until(timeout time.Duration, expr string) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return nil
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	if last == nil {
		last = fmt.Errorf("not true after %s", timeout)
	}
	return last
}

// pageText is a JavaScript expression for the page's visible text, with
// that of its iframes: the Web UI renders markdown (summaries, current
// details) in sandboxed iframes, read from their srcdoc when their document
// is out of reach.
const pageText = `(() => {
	let s = document.body ? document.body.innerText : "";
	for (const f of document.querySelectorAll("iframe")) {
		try { s += "\n" + f.contentDocument.body.innerText; }
		catch (e) { s += "\n" + (f.srcdoc || "").replace(/<[^>]*>/g, ""); }
	}
	return s;
})()`

// text returns the page's visible text, its iframes' included.
func (b *browser) text() string {
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](pageText))
	if err != nil {
		return "(no text: " + err.Error() + ")"
	}
	return s
}

func (b *browser) url() string {
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.href`))
	if err != nil {
		return "?"
	}
	return s
}

// screenshot saves a full-page PNG in a directory under $TMPDIR that is
// kept when the test fails, and logs its path.
func (b *browser) screenshot(name string) {
	b.n++
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(b.dir, fmt.Sprintf("%02d-%s.png", b.n, name))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	b.t.Logf("screenshot of %s: %s", b.url(), path)
}
