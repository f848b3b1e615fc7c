package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
)

// TestEveryCommandsHelp renders each command's help and checks what a
// reader relies on: one dash style, no garbled placeholders, no flags for
// settings the command never uses, no "(default default)".
func TestEveryCommandsHelp(t *testing.T) {
	t.Parallel()
	temporal := []string{"--temporal-address", "--temporal-namespace", "--task-queue"}
	never := map[string][]string{
		"migrate":   append([]string{"--migrate"}, temporal...),
		"reconcile": append([]string{"--migrate"}, temporal...),
		"resolve":   {"--migrate"}, // It sends a waiting run the decide update.
		"attention": {"--migrate"},
		"show":      {"--migrate"},
		"start":     {"--migrate"},
		"refund":    {"--migrate"},
	}
	code, top, _ := starter(t, nil, "help")
	require.Equal(t, 0, code)
	require.NotContains(t, top, "(default default)")
	require.Contains(t, top, "source .demo/env")
	flagLine := regexp.MustCompile(`(?m)^  -`)
	for _, c := range commands() {
		code, out, _ := starter(t, nil, c.name, "-h")
		require.Equal(t, 0, code, c.name)
		usage, _, _ := strings.Cut(out, "\n")
		require.True(t, strings.HasPrefix(usage, "Usage: starter "+c.name+" "), usage)
		require.NotRegexp(t, `(^|\s)-[a-z]`, usage, "the usage line spells flags --flag")
		require.NotContains(t, out, "`", "%s: a backquote is left of a placeholder", c.name)
		require.NotContains(t, out, "(default default)", c.name)
		require.NotEmpty(t, flagLine.FindAllString(out, -1), c.name)
		require.NotRegexp(t, `(?m)^  -[a-z]`, out, "%s: every flag is listed as --flag", c.name)
		for _, f := range never[c.name] {
			require.NotRegexp(t, `(?m)^  `+f+`( |$)`, out, "%s lists %s, which it never uses", c.name, f)
		}
		if c.name != "serve" {
			require.Regexp(t, `(?m)^  --json$`, out, "%s has --json", c.name)
		}
	}
	_, out, _ := starter(t, nil, "resolve", "-h")
	require.Contains(t, out, "  --as outcome\n    \tthe outcome: done (it happened) or retry (it did not) (required)")

	// Errors from flag parsing spell flags the same way.
	for args, want := range map[string]string{
		"show --nope":       "flag provided but not defined: --nope",
		"show --tenant":     "flag needs an argument: --tenant",
		"show --json=maybe": `invalid boolean value "maybe" for --json`,
		"create --amount x": `invalid value "x" for flag --amount`,
	} {
		code, _, errOut := starter(t, nil, strings.Fields(args)...)
		require.Equal(t, 2, code, args)
		require.Contains(t, errOut, want, args)
	}
}

func TestResolveRefusesBadInputWithExitTwo(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	env := withTemporal(t, map[string]string{"DATABASE_URL": url})
	fxc := effectstest.NewClient(t, pool, nil)
	ctx := context.Background()
	key := effects.MustKey("acme", "order", "r2", "receipt")
	cl, err := fxc.Claim(ctx, effects.ClaimParams{Key: key, Owner: "wf/receipt"})
	require.NoError(t, err)
	require.NoError(t, fxc.Fail(ctx, cl, effects.NewCodedError("ambiguous", "may have been sent")))
	runDeleted(t, pool, key)

	resolve := func(args ...string) []string {
		return append([]string{"resolve", "--key", key.String(), "--by", "ada"}, args...)
	}
	bigResult := `{"message_id":"` + strings.Repeat("x", effects.MaxResultBytes) + `"}`
	long := strings.Repeat("r", pipeline.MaxDecisionReason+1)
	for _, c := range []struct {
		args []string
		want string
	}{
		{resolve("--as", "done", "--reason", long, "--result", `{"message_id":"m"}`), "--reason is too long: 201 bytes, at most 200"},
		{resolve("--as", "done", "--reason", "x", "--result", bigResult), "--result is too large: 4113 bytes, at most 4096"},
		{resolve("--as", "done", "--reason", "x"), `--result is required with done: the step's outcome, {"message_id":"…","collapsed":false}`},
		{resolve("--as", "done", "--reason", "x", "--result", "{"), "--result is not valid JSON"},
		{resolve("--as", "done", "--reason", "x", "--result", `{"id":"m"}`), `--result has the unknown field "id"`},
		{resolve("--as", "done", "--reason", "x", "--result", `{"message_id":""}`), "--result is not the step's outcome: message_id is required"},
		{resolve("--as", "retry", "--reason", "x", "--result", `{"message_id":"m"}`), "--result goes with done only"},
		{resolve("--as", "retry", "--reason", "x", "--result", "null"), "--result goes with done only"},
		{resolve("--as", "retry", "--reason", "x", "--unverified"), "--unverified goes with done only"},
		{resolve("--as", "retry", "--reason", "checked\x1b[2J SendGrid"), `--reason holds '\x1b' at byte 7, a control or invisible character`},
		{resolve("--as", "retry", "--reason", "line one\nline two"), `--reason holds '\n' at byte 8`},
		{resolve("--as", "retry", "--reason", "evil\u202etxt"), `'\u202e' at byte 4`},
		{resolve("--as", "retry\x1b", "--reason", "x"), `invalid --as "retry\x1b"`},
		{resolve("--as", "retry", "--reason", "x", "--by", strings.Repeat("b", pipeline.MaxDecisionBy+1)), "--by (who decides) is too long: 65 bytes, at most 64"},
		// The batch's flags with --key: refused, not ignored (a --dry-run that decides).
		{resolve("--as", "retry", "--reason", "x", "--dry-run"), "--dry-run, --rate and --step go with --query only"},
		{resolve("--as", "retry", "--reason", "x", "--rate", "1"), "--dry-run, --rate and --step go with --query only"},
		// Every problem at once.
		{[]string{"resolve", "--key", key.String(), "--as", "done"},
			"--reason is required; --by (who decides) is required (it defaults to $USER); --result is required with done"},
	} {
		code, out, errOut := starter(t, env, c.args...)
		require.Equal(t, 2, code, "%q: %s", c.args, errOut)
		require.Contains(t, errOut, c.want, "%q", c.args)
		require.Empty(t, out)
	}
	rec, err := fxc.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, effects.StateFailedTerminal, rec.State, "bad input changes nothing")

	// The longest reason fits, with the longest operator.
	code, out, errOut := starter(t, env, "resolve", "--key", key.String(), "--as", "retry", "--reason", long[1:],
		"--by", strings.Repeat("b", pipeline.MaxDecisionBy), "--json")
	require.Equal(t, 0, code, errOut)
	var got effects.Record
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, effects.StateFailedTransient, got.State)
}

// TestShowEscapesStoredText stores text with terminal escapes, bidi
// overrides and zero-width characters (as an older keyed, a provider's
// error or a direct write could) and checks that show prints them escaped,
// and that --json stays valid JSON holding the same values.
func TestShowEscapesStoredText(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	env := map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1"}
	ctx := context.Background()
	const (
		email = "ann\u202emoc.elpmaxe@\x1b[31m\u200b\ufeff\u0085"
		pm    = "pm_card\a\x1b]8;;http://evil.example\x07visa"
		msg   = "declined\r\x1b[2Kall good\u2028"
	)
	_, err := pool.Exec(ctx, `INSERT INTO orders (tenant_id, id, amount_minor, currency, customer_email, payment_method)
VALUES ('acme', 'esc-1', 100, 'usd', $1, $2)`, email, pm)
	require.NoError(t, err)
	fxc := effectstest.NewClient(t, pool, nil)
	cl, err := fxc.Claim(ctx, effects.ClaimParams{Key: effects.MustKey("acme", "order", "esc-1", "charge"), Owner: "wf/charge"})
	require.NoError(t, err)
	require.NoError(t, fxc.Fail(ctx, cl, effects.NewCodedError("card_declined", msg)))

	code, out, errOut := starter(t, env, "show", "--tenant", "acme", "--order", "esc-1")
	require.Equal(t, 0, code, errOut)
	for i, r := range out {
		require.True(t, r == '\n' || printable(r), "byte %d of show's output is %q:\n%s", i, r, out)
	}
	require.Contains(t, out, `"ann\u202emoc.elpmaxe@\x1b[31m\u200b\ufeff\u0085"`)
	require.Contains(t, out, `"pm_card\a\x1b]8;;http://evil.example\avisa"`)
	require.Contains(t, out, `error card_declined: "card_declined: declined\r\x1b[2Kall good\u2028"`)

	code, out, errOut = starter(t, env, "show", "--tenant", "acme", "--order", "esc-1", "--json")
	require.Equal(t, 0, code, errOut)
	for i, r := range out {
		require.True(t, r == '\n' || printable(r), "byte %d of show --json is %q", i, r)
	}
	var shown showResult
	require.NoError(t, json.Unmarshal([]byte(out), &shown), out)
	require.Equal(t, email, shown.Order.CustomerEmail)
	require.Equal(t, pm, shown.Order.PaymentMethod)
	require.Len(t, shown.Effects, 1)
	require.Equal(t, "card_declined: "+msg, shown.Effects[0].ErrorMessage)
}

func TestCleanAndWriteJSON(t *testing.T) {
	t.Parallel()
	require.Equal(t, "acme:order:9f3a", clean("acme:order:9f3a"))
	require.Equal(t, "Bücher €5 ✓", clean("Bücher €5 ✓"), "printable non-ASCII stays as is")
	require.Equal(t, `"\"quoted\""`, clean(`"quoted"`), "a quoted value is always an escaped one")
	require.Equal(t, `"a\xffb"`, clean("a\xffb"))
	require.Equal(t, `"\U0001d173x"`, clean("\U0001d173x"), "format characters beyond the BMP")

	var b strings.Builder
	require.NoError(t, writeJSON(&b, map[string]string{"s": "x\u202e\U000e0001y\x00"}))
	require.Equal(t, "{\n  \"s\": \"x\\u202e\\udb40\\udc01y\\u0000\"\n}\n", b.String())
	var back map[string]string
	require.NoError(t, json.Unmarshal([]byte(b.String()), &back))
	require.Equal(t, "x\u202e\U000e0001y\x00", back["s"])
}

// TestServeConfigurationIsOneMessage checks that serve reports a bad key
// list, a bad --addr, a bad KEYED_SERVE_RELAY and the shared settings in one
// message with exit status 2, and never a key.
// serve refuses a schema without keyed's tables at start, naming the fix,
// instead of answering every request with an error.
func TestServeRefusesAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	code, out, errOut := starter(t, map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1",
		"KEYED_API_KEYS": "acme=sk_live_0123456789abcdef"}, "serve", "--addr", "127.0.0.1:0")
	require.Equal(t, 2, code, out+errOut)
	require.Contains(t, errOut, "keyed's tables are missing from")
	require.Contains(t, errOut, "run `starter migrate` against it")
	require.NotContains(t, errOut, "sk_live_0123456789abcdef")
}

func TestServeConfigurationIsOneMessage(t *testing.T) {
	t.Parallel()
	const key = "sk_live_0123456789abcdef"
	code, out, errOut := starter(t, map[string]string{
		"TEMPORAL_ADDRESS":  "no-port",
		"KEYED_SERVE_RELAY": "perhaps",
		"KEYED_API_KEYS":    "acme=" + key + ",globex",
	}, "serve", "--addr", "localhost:99999")
	require.Equal(t, 2, code, errOut)
	require.Empty(t, out)
	require.Equal(t, 1, strings.Count(errOut, "invalid starter configuration (4 problems)"), errOut)
	for _, want := range []string{
		`KEYED_API_ADDR (--addr): "localhost:99999": port "99999" is not a number from 0 to 65535`,
		`KEYED_SERVE_RELAY (--relay): "perhaps" is not true or false`,
		"KEYED_API_KEYS: bad API key configuration: entry 2: want tenant=key",
		"TEMPORAL_ADDRESS (--temporal-address)",
	} {
		require.Contains(t, errOut, want)
	}
	require.NotContains(t, errOut, key)

	// A flag overrides a bad variable; no keys at all is a problem too.
	code, _, errOut = starter(t, map[string]string{"KEYED_SERVE_RELAY": "perhaps", "KEYED_API_ADDR": "nope"}, "serve", "--relay=false", "--addr", "[::1]:x")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "invalid starter configuration (2 problems)")
	require.Contains(t, errOut, "KEYED_API_KEYS: no API keys configured")
	require.Contains(t, errOut, `KEYED_API_ADDR (--addr): "[::1]:x": port "x"`)

	// A tenant too long to form its effect keys is refused up front.
	tenantKeys := func(n int) map[string]string {
		return map[string]string{"KEYED_API_KEYS": strings.Repeat("t", n) + "=" + key}
	}
	code, _, errOut = starter(t, tenantKeys(api.MaxTenantLen+1), "serve", "--addr", "nope")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "(2 problems)")
	require.Contains(t, errOut, "(172 bytes) is too long: at most 171 bytes")
	code, _, errOut = starter(t, tenantKeys(api.MaxTenantLen), "serve", "--addr", "nope")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "(1 problems)", "a tenant of %d bytes is fine", api.MaxTenantLen)
	require.NotContains(t, errOut, key)
}

// TestMissingTablesNameTheSchema checks that a command pointed at a schema
// without keyed's tables says which schema it searched and how to point
// DATABASE_URL elsewhere, as bad configuration (exit 2), and that migrate
// reports where it applied.
func TestMissingTablesNameTheSchema(t *testing.T) {
	t.Parallel()
	schema, url := effectstest.NewSchema(t)
	env := map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1"}
	code, out, errOut := starter(t, env, "show", "--tenant", "acme", "--order", "o1")
	require.Equal(t, 2, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, `relation "orders" does not exist`)
	require.Contains(t, errOut, `keyed's tables are missing from postgres://postgres@127.0.0.1:5432/postgres?search_path=`+schema+
		`: searched schema "`+schema+`" (search_path `+schema+`)`)
	require.Contains(t, errOut, "source .demo/env")
	require.NotContains(t, errOut, "--migrate")

	code, _, errOut = starter(t, env, "resolve", "--key", "acme:order:o1:receipt", "--as", "retry", "--by", "ada", "--reason", "x")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, `searched schema "`+schema+`"`)

	env["DATABASE_URL"] = effectstest.WithSearchPath(effectstest.DatabaseURL(), "no_such_schema_x")
	code, _, errOut = starter(t, env, "start", "--tenant", "acme", "--order", "o1")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "search_path no_such_schema_x names no existing schema")

	env["DATABASE_URL"] = url
	code, out, errOut = starter(t, env, "migrate", "--json")
	require.Equal(t, 0, code, errOut)
	var res migrateResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, schema, res.Schema)
	require.NotEmpty(t, res.Applied)
	code, out, errOut = starter(t, env, "migrate")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "schema "+schema+" is up to date\n", out)
}

// TestReconcileConfigurationIsOneMessage checks that reconcile's Stripe
// settings are reported with the shared ones, without credentials.
func TestReconcileConfigurationIsOneMessage(t *testing.T) {
	t.Parallel()
	code, out, errOut := starter(t, map[string]string{
		"STRIPE_SECRET_KEY": "pk_live_abc",
		"STRIPE_API_BASE":   "ftp://user:s3cr3t@x",
		"LOG_LEVEL":         "loud",
	}, "reconcile")
	require.Equal(t, 2, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, "invalid starter configuration (3 problems)")
	require.Contains(t, errOut, "STRIPE_SECRET_KEY: must start with sk_ or rk_")
	require.Contains(t, errOut, `STRIPE_API_BASE (--stripe-api-base): "ftp://x" carries credentials`)
	require.Contains(t, errOut, "LOG_LEVEL (--log-level)")
	require.NotContains(t, errOut, "s3cr3t")
	require.NotContains(t, errOut, "pk_live_abc")
}

// TestAFailedOrderIsFinal: start and resolve refuse a failed order with exit
// 2 and the same reason, and leave its stored decline as it is.
func TestAFailedOrderIsFinal(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	env := map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1"}
	fxc := effectstest.NewClient(t, pool, nil)
	ctx := context.Background()
	store, err := orders.NewStore(pool)
	require.NoError(t, err)
	_, _, err = store.Create(ctx, orders.NewOrder{TenantID: "acme", ID: "d1", AmountMinor: 500, Currency: "eur",
		CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_chargeDeclined"})
	require.NoError(t, err)
	key := effects.MustKey("acme", "order", "d1", "charge")
	cl, err := fxc.Claim(ctx, effects.ClaimParams{Key: key, Owner: "wf/charge"})
	require.NoError(t, err)
	require.NoError(t, fxc.Fail(ctx, cl, effects.NewCodedError("card_declined", "declined")))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = store.TransitionTx(ctx, tx, "acme", "d1", orders.StatusPending, orders.StatusFailed, "acme:order:d1:mark_failed")
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	for _, args := range [][]string{
		{"start", "--tenant", "acme", "--order", "d1"},
		{"resolve", "--key", key.String(), "--as", "retry", "--by", "ada", "--reason", "customer has a new card"},
		{"resolve", "--key", key.String(), "--as", "done", "--by", "ada", "--reason", "x",
			"--result", `{"payment_intent_id":"pi_1","status":"succeeded","amount_minor":500,"currency":"eur"}`},
	} {
		code, out, errOut := starter(t, env, args...)
		require.Equal(t, 2, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, "order acme/d1 is failed: a failed order is final; create a new order", "%q", args)
		require.Empty(t, out)
	}
	rec, err := fxc.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, "card_declined", rec.ErrorCode, "the stored decline is kept")
}
