package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/skein-ai/skein/gateway"
	"github.com/skein-ai/skein/store"
)

const keysUsage = `usage: skein keys create --name NAME [--admin] [--data DIR | --state postgres://…]
       skein keys list            [--data DIR | --state postgres://…]
       skein keys revoke ID       [--data DIR | --state postgres://…]`

// authMode decides how a server listening on addr authenticates. Open mode (any key is a
// tenant) is allowed only on loopback, where only this machine's users reach it.
func authMode(flagValue, addr string) (string, error) {
	switch flagValue {
	case gateway.AuthKeys:
		return gateway.AuthKeys, nil
	case "", gateway.AuthOpen:
	default:
		return "", fmt.Errorf("--auth %q: want open or keys", flagValue)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--addr %q: %w", addr, err)
	}
	ip := net.ParseIP(host)
	if host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return gateway.AuthOpen, nil
	}
	return "", fmt.Errorf("refusing to listen on %s with --auth open: anyone who reaches it would be a tenant. "+
		"Use --auth keys and issue keys with `skein keys create --name NAME [--admin]` on the same --data or --state "+
		"(the first one with --admin), or listen on 127.0.0.1", addr)
}

// keysCommand runs `skein keys …` against the same state store as the server: SQLite in --data,
// or the PostgreSQL of --state. A new key goes to out alone (for scripts); notes go to msgs.
func keysCommand(args []string, out, msgs io.Writer) error {
	if len(args) == 0 {
		return errors.New(keysUsage)
	}
	if isHelp(args[0]) {
		fmt.Fprintln(out, keysUsage)
		return nil
	}
	fs := flag.NewFlagSet("keys "+args[0], flag.ContinueOnError)
	fs.SetOutput(msgs)
	data := fs.String("data", envDefault("data", "./skein-data"), "data directory of the server (SQLite state)")
	stateURL := fs.String("state", envDefault("state", ""), "the server's postgres:// state store, if it has one")
	name := fs.String("name", "", "label of the new key (who or what uses it)")
	admin := fs.Bool("admin", false, "the new key may use the fleet and key-management endpoints")
	pos, err := parseArgs(fs, args[1:], "skein keys "+args[0]+" [flags]")
	if err != nil {
		return err
	}
	ctx := context.Background()
	switch args[0] {
	case "create":
		if len(pos) != 0 {
			return errors.New(keysUsage)
		}
		st, err := openKeyStore(*data, *stateURL, true)
		if err != nil {
			return err
		}
		defer st.Close()
		key, row, err := gateway.IssueKey(ctx, st, *name, *admin)
		if err != nil {
			return err
		}
		role := "tenant"
		if row.Admin {
			role = "admin"
		}
		fmt.Fprintln(out, key)
		fmt.Fprintf(msgs, "created %s key %s (%q, tenant %s); it is shown only now\n", role, row.ID, row.Name, gateway.KeyTenant(row.ID))
		return nil
	case "list":
		if len(pos) != 0 {
			return errors.New(keysUsage)
		}
		st, err := openKeyStore(*data, *stateURL, false)
		if err != nil {
			return err
		}
		defer st.Close()
		keys, err := st.Keys(ctx)
		if err != nil {
			return fmt.Errorf("listing keys: %w", err)
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tROLE\tTENANT\tCREATED\tSTATUS")
		for _, k := range keys {
			role, status := "tenant", "active"
			if k.Admin {
				role = "admin"
			}
			if k.Revoked != nil {
				status = "revoked " + k.Revoked.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, role, gateway.KeyTenant(k.ID), k.Created.Format(time.RFC3339), status)
		}
		return tw.Flush()
	case "revoke":
		if len(pos) != 1 {
			return errors.New(keysUsage)
		}
		st, err := openKeyStore(*data, *stateURL, false)
		if err != nil {
			return err
		}
		defer st.Close()
		if err := st.RevokeKey(ctx, pos[0], time.Now()); err != nil {
			return fmt.Errorf("revoking key %q: %w", pos[0], err)
		}
		fmt.Fprintf(msgs, "revoked key %s: requests with it fail from now on\n", pos[0])
		return nil
	}
	return fmt.Errorf("unknown keys command %q\n%s", args[0], keysUsage)
}

// openKeyStore opens the server's state store; only create may start a new SQLite one (the
// bootstrap before the first `serve`), so a mistyped --data is an error, not an empty list.
func openKeyStore(data, stateURL string, mayCreate bool) (store.Store, error) {
	if stateURL != "" {
		if !strings.HasPrefix(stateURL, "postgres://") && !strings.HasPrefix(stateURL, "postgresql://") {
			return nil, fmt.Errorf("--state: want a postgres:// URL, got %q", stateURL)
		}
		return store.OpenPostgres(stateURL)
	}
	path := filepath.Join(data, "state.db")
	if mayCreate {
		if err := os.MkdirAll(data, 0o755); err != nil {
			return nil, err
		}
	} else if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no state store in %s (is --data the server's data directory?): %w", data, err)
	}
	return store.OpenSQLite(path)
}
