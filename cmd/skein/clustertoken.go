package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/skein-ai/skein/store"
)

// tokenFile holds the cluster token of a gateway that was given none, in its data directory.
const tokenFile = "worker-token"

// clusterToken returns the token workers must present: the one given, else (gateways sharing
// a store, shared != nil) the one kept in the store, else the one kept in the data directory,
// else a new random one kept there (file mode 0600); generated reports the last case. In the
// store, the first gateway's token is every gateway's; a token its data directory already held
// is the one it offers, so that an upgraded gateway's workers keep theirs.
func clusterToken(dataDir, given string, shared store.Store) (token string, generated bool, err error) {
	if given != "" {
		return given, false, nil
	}
	path := filepath.Join(dataDir, tokenFile)
	kept, err := readToken(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", false, err
	}
	if shared != nil {
		candidate := kept
		if candidate == "" {
			if candidate, err = randomToken(); err != nil {
				return "", false, err
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := shared.ClusterSecret(ctx, tokenSecret, []byte(candidate))
		if err != nil {
			return "", false, fmt.Errorf("the cluster token in the store: %w", err)
		}
		return string(b), kept == "" && string(b) == candidate, nil
	}
	if kept != "" {
		return kept, false, nil
	}
	if token, err = randomToken(); err != nil {
		return "", false, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", false, fmt.Errorf("writing the cluster token: %w", err)
	}
	_, err = io.WriteString(f, token+"\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", false, fmt.Errorf("writing the cluster token: %w", err)
	}
	return token, true, nil
}

// tokenSecret names the cluster token among the store's cluster secrets.
const tokenSecret = "worker-token"

func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// readToken reads a token file; it must be readable by its owner only.
func readToken(path string) (string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if info.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("%s is readable by others (mode %v): chmod 600 it", path, info.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return token, nil
}

// settleWorkerToken settles the cluster token of a server: none unless it accepts workers (skein
// gateway always does, skein serve with --accept-workers). A token it generates is printed once,
// with the command that starts a worker.
func settleWorkerToken(accept bool, dataDir, given, addr string, shared store.Store, out io.Writer) (string, error) {
	if !accept {
		if given != "" {
			fmt.Fprintln(out, "skein: --worker-token ignored: this server accepts no workers (add --accept-workers)")
		}
		return "", nil
	}
	token, generated, err := clusterToken(dataDir, given, shared)
	if err != nil {
		return "", err
	}
	if generated && shared != nil {
		fmt.Fprintf(out, "\nGenerated the cluster token (kept in the shared store for every gateway, shown only now). Start a worker with:\n\n"+
			"  skein worker --gateway http://%s --model DIR --worker-token %s\n\n", addr, token)
	} else if generated {
		fmt.Fprintf(out, "\nGenerated the cluster token (kept in %s, shown only now). Start a worker with:\n\n"+
			"  skein worker --gateway http://%s --model DIR --data %s --worker-token %s\n\n",
			filepath.Join(dataDir, tokenFile), addr, dataDir, token)
	}
	return token, nil
}
