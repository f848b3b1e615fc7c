package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every demo is on its own: its schema and task queue carry its ID, so that
// two demos on one Postgres (or a demo and the tests) never read each
// other's orders or outbox rows, and one demo's relay never starts the
// other's runs.
const (
	schemaPrefix    = "keyed_demo_"
	taskQueuePrefix = "keyed-demo-"
)

// newID returns a demo's ID: 8 random hex digits.
func newID() (string, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("pick the demo's ID: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// schemaLockClass is the first key of the advisory lock a demo holds on its
// schema while it runs: hashtext('keyed_demo'), so that it meets no other
// application's locks.
const schemaLockClass = `hashtext('keyed_demo')`

// claimSchema takes the advisory lock on schema on conn, drops the schemas
// of demos that are gone (no session holds their lock: killed before they
// could drop their own), and creates schema. The lock comes first, so that
// no other demo's sweep can take a schema this one just created. It returns
// the schemas it dropped.
func claimSchema(ctx context.Context, conn *pgx.Conn, schema string) (dropped []string, err error) {
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+schemaLockClass+`, hashtext($1))`, schema).Scan(&locked); err != nil {
		return nil, fmt.Errorf("lock schema %s: %w", schema, err)
	}
	if !locked {
		return nil, fmt.Errorf("lock schema %s: another session holds it; run the demo again", schema)
	}
	if dropped, err = sweepSchemas(ctx, conn); err != nil {
		return dropped, err
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return dropped, fmt.Errorf("create schema %s: %w", schema, err)
	}
	return dropped, nil
}

// sweepSchemas drops every demo schema whose lock it can take, releasing
// the lock after.
func sweepSchemas(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1) ORDER BY nspname`, schemaPrefix)
	if err != nil {
		return nil, fmt.Errorf("list demo schemas: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list demo schemas: %w", err)
	}
	var dropped []string
	for _, name := range names {
		var free bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+schemaLockClass+`, hashtext($1))`, name).Scan(&free); err != nil {
			return dropped, fmt.Errorf("lock schema %s: %w", name, err)
		}
		if !free {
			continue // a running demo's
		}
		_, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
		_, uerr := conn.Exec(ctx, `SELECT pg_advisory_unlock(`+schemaLockClass+`, hashtext($1))`, name)
		if err = errors.Join(err, uerr); err != nil {
			return dropped, fmt.Errorf("drop schema %s left by a demo that is gone: %w", name, err)
		}
		dropped = append(dropped, name)
	}
	return dropped, nil
}

// dropSchema drops schema and closes conn, which releases the schema's
// lock. It runs when the demo exits, on a fresh context: the demo's own
// has ended by then.
func dropSchema(conn *pgx.Conn, schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	if err != nil {
		err = fmt.Errorf("drop schema %s: %w", schema, err)
	}
	return errors.Join(err, conn.Close(ctx))
}

// envOwner matches the line of .demo/env that names the process that wrote
// it (writeEnvFile).
var envOwner = regexp.MustCompile(`(?m)^# Written by demo [0-9a-f]+, process (\d+)\.$`)

// removeStaleEnv removes the env file at path unless the demo that wrote it
// still runs: a file of a demo that is gone points at servers that are gone
// too, but another demo's, kept up from the same checkout, stays.
func removeStaleEnv(path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if m := envOwner.FindSubmatch(b); m != nil {
		if pid, err := strconv.Atoi(string(m[1])); err == nil && alive(pid) {
			return nil
		}
	}
	return removeIfExists(path)
}

// removeOwnEnv removes the env file at path if it still holds what this
// demo wrote there (nil: it wrote nothing), and leaves another demo's.
func removeOwnEnv(path string, written []byte) error {
	if written == nil {
		return nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) || err == nil && !bytes.Equal(b, written) {
		return nil
	}
	if err != nil {
		return err
	}
	return removeIfExists(path)
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
