// Command starter creates orders and starts, inspects and serves their
// checkout. It is what an operator or a script uses next to the worker:
//
//	starter create --tenant acme --order 9f3a --amount 1999 --currency usd \
//	    --email ann@example.com --payment-method pm_card_visa
//	starter start --tenant acme --order 9f3a
//	starter show --tenant acme --order 9f3a
//	starter refund --tenant acme --order 9f3a --refund r1 --amount 500 --reason damaged
//	starter resolve --key acme:order:9f3a:receipt --as retry --reason "…"
//	starter reconcile --since 25h
//	starter doctor --rules deploy/prometheus/keyed.rules.yml
//	starter serve
//
// It needs DATABASE_URL and the TEMPORAL_* settings; only reconcile also
// needs STRIPE_SECRET_KEY, from the environment. `make demo KEEP=1` writes
// the demo's settings to .demo/env: `source .demo/env` first to reach it.
// Run `starter help` or `starter COMMAND -h` for every flag; each command
// lists only the flags it uses.
//
// Bad input and bad configuration exit 2 with one message listing every
// problem. Stored text is printed with control and invisible characters
// escaped, and --json output escapes them too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// gRPC's gzip at its fastest level (config.UseFastGzip), set before any
// connection.
func init() { config.UseFastGzip() }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], &env{stdout: os.Stdout, stderr: os.Stderr, lookup: os.LookupEnv, environ: os.Environ()})
	stop()
	os.Exit(code)
}

// env is the process around a command, replaceable in tests.
type env struct {
	stdout, stderr io.Writer
	lookup         func(string) (string, bool)
	// environ, as os.Environ, is checked for misspelled settings.
	environ []string
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	// run parses args and does the work. It returns a *usageError for bad
	// input or an error matching config.ErrInvalid for bad configuration
	// (exit 2), and any other error for a failure (exit 1).
	run func(ctx context.Context, e *env, args []string) error
}

func commands() []command {
	return []command{
		{"create", "create an order in Postgres and start its checkout", runCreate},
		{"start", "start (or join) the checkout of an existing order", runStart},
		{"refund", "request a refund of a paid order and start its refund run", runRefund},
		{"show", "show an order, each of its effects and refunds, and the workflow's view of each step", runShow},
		{"migrate", "apply keyed's database migrations", runMigrate},
		{"relay", "run an outbox relay on its own", runRelay},
		{"reconcile", "compare keyed's charge records with Stripe's payment intents", runReconcile},
		{"attention", "list the order and refund runs that wait for an operator's decision", runAttention},
		{"resolve", "settle an effect whose outcome keyed cannot know (operators)", runResolve},
		{"doctor", "check the deployment against keyed's hardening checklist", runDoctor},
		{"serve", "serve keyed's HTTP API and outbox relay", runServe},
	}
}

const topUsage = `Usage: starter COMMAND [flags]

Creates orders and starts, inspects or serves their checkout on Temporal.

Commands:
%s
Run 'starter COMMAND -h' for a command's flags.

Environment (flags override the non-secret ones; see docs/configuration.md):
%s
Some commands read more (see 'starter COMMAND -h'):
%s
'make demo KEEP=1' writes these for its servers to .demo/env: run 'source .demo/env' first.

Exit status: 0 on success, 1 when Postgres, Temporal or a provider failed, 2 for
bad input (no such order, one that exists with other details included), 3 when
reconcile found disagreements with Stripe, and for doctor 3 when a check warned
and 4 when one failed.
`

func printTopUsage(w io.Writer) {
	var cmds, env, more strings.Builder
	for _, c := range commands() {
		fmt.Fprintf(&cmds, "  %-9s %s\n", c.name, c.summary)
		if names := commandSettings(c.name); len(names) > 0 {
			fmt.Fprintf(&more, "  %-9s %s\n", c.name, strings.Join(names, ", "))
		}
	}
	config.Usage(&env, config.Starter, config.InStarter)
	fmt.Fprintf(w, topUsage, cmds.String(), env.String(), more.String())
}

// commandSettings lists the variables the command name reads beyond the
// shared ones.
func commandSettings(name string) []string {
	var names []string
	for _, s := range config.Settings {
		if s.For&config.CommandUses(name) != 0 && s.For&config.InStarter == 0 {
			names = append(names, s.Env)
		}
	}
	return names
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		printTopUsage(e.stderr)
		return 2
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help", "help":
		if name == "help" && len(rest) > 0 {
			return run(ctx, []string{rest[0], "-h"}, e)
		}
		printTopUsage(e.stdout)
		return 0
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		err := c.run(ctx, e, rest)
		var uerr *usageError
		var ecerr *exitCodeError
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errFindings):
			return exitFindings
		case errors.As(err, &ecerr):
			return ecerr.code
		case errors.As(err, &uerr), errors.Is(err, config.ErrInvalid), refused(err): // bad input, or configuration found bad on start
			fmt.Fprintf(e.stderr, "starter %s: %v\n", name, err)
			return 2
		default:
			fmt.Fprintf(e.stderr, "starter %s: %v\n", name, err)
			return 1
		}
	}
	fmt.Fprintf(e.stderr, "starter: unknown command %q\n\n", name)
	printTopUsage(e.stderr)
	return 2
}

// usageError is bad input: a missing or invalid flag, or invalid
// configuration. Nothing was created.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// refusals are the domain's answers to an operator's input (no such order
// or refund, one that exists with other details, a final order): bad
// input, exit 2, not a failure of Postgres or Temporal, exit 1.
var refusals = []error{orders.ErrNotFound, orders.ErrConflict, orders.ErrFinal, refunds.ErrNotFound, refunds.ErrConflict}

// refused reports whether err is one of the refusals.
func refused(err error) bool {
	return slices.ContainsFunc(refusals, func(r error) bool { return errors.Is(err, r) })
}

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// flags is a command's FlagSet together with the configuration's flags.
type flags struct {
	*flag.FlagSet
	loader *config.Loader
	e      *env
	// checks run after parsing and before the configuration is validated;
	// they report problems through loader.Problem, so that every problem
	// comes in one message.
	checks []func()
}

// newFlags returns a command's flags. omit names the configuration's
// settings the command never uses: they get no flags.
func newFlags(e *env, name, synopsis, description string, omit ...config.FlagGroup) *flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package prints its errors and the usage itself; parse
	// reports errors once and prints the usage only for -h.
	fs.SetOutput(io.Discard)
	l := config.NewLoader(config.Starter, e.lookup)
	l.Command(name)
	l.Omit(omit...)
	l.Environ(e.environ)
	f := &flags{FlagSet: fs, loader: l, e: e}
	fs.Usage = func() {
		fmt.Fprintf(e.stdout, "Usage: starter %s %s\n\n%s\n\nFlags:\n", name, synopsis, description)
		config.PrintFlags(e.stdout, fs)
		if own := config.CommandUses(name); own != 0 {
			fmt.Fprintf(e.stdout, "\nEnvironment of %s, besides the shared settings:\n", name)
			config.Usage(e.stdout, config.Starter, own)
		}
		fmt.Fprintf(e.stdout, "\nSee 'starter help' for the shared environment variables.\n")
	}
	return f
}

// check adds fn to the checks run after parsing.
func (f *flags) check(fn func()) { f.checks = append(f.checks, fn) }

// parse binds the configuration flags next to the command's, parses args,
// and returns the validated configuration. Bad input is a *usageError; -h
// prints the usage to stdout and returns flag.ErrHelp.
func (f *flags) parse(args []string) (*config.Config, error) {
	f.loader.BindFlags(f.FlagSet)
	usage := f.Usage
	f.Usage = func() {}
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return nil, err
		}
		return nil, usagef("%s (see 'starter %s -h')", dashes(err.Error()), f.Name())
	}
	if f.NArg() > 0 {
		return nil, usagef("unexpected arguments: %s", strings.Join(f.Args(), " "))
	}
	for _, fn := range f.checks {
		fn()
	}
	cfg, err := f.loader.Load()
	if err != nil {
		return nil, &usageError{msg: err.Error()}
	}
	return cfg, nil
}

// dashes spells the flag package's "-name" as "--name", the way usage
// lines and flag lists do.
func dashes(msg string) string {
	for _, p := range []string{"defined: -", "flag -", "argument: -", `" for -`} {
		msg = strings.ReplaceAll(msg, p, p[:len(p)-1]+"--")
	}
	return msg
}

// runApp builds the starter's fx app, populates targets from it, and runs
// fn between its start and stop.
func (f *flags) runApp(ctx context.Context, cfg *config.Config, fn func(ctx context.Context) error, targets ...any) error {
	logger := slog.New(slog.NewTextHandler(f.e.stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	app := fx.New(fxapp.Starter(cfg, logger, fx.Populate(targets...)))
	return fxapp.Run(ctx, app, fn)
}

// isSet reports whether the flag name was given on the command line.
func (f *flags) isSet(name string) bool {
	set := false
	f.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set
}
