package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// tokenFile holds the cluster token of a gateway that was given none, in its data directory.
const tokenFile = "worker-token"

// clusterToken returns the token workers must present: the one given, else the one kept in the
// data directory, else a new random one written there (mode 0600); generated reports the last case.
func clusterToken(dataDir, given string) (token string, generated bool, err error) {
	if given != "" {
		return given, false, nil
	}
	path := filepath.Join(dataDir, tokenFile)
	if token, err := readToken(path); err == nil {
		return token, false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", false, err
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", false, err
	}
	token = hex.EncodeToString(b)
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
func settleWorkerToken(accept bool, dataDir, given, addr string, out io.Writer) (string, error) {
	if !accept {
		if given != "" {
			fmt.Fprintln(out, "skein: --worker-token ignored: this server accepts no workers (add --accept-workers)")
		}
		return "", nil
	}
	token, generated, err := clusterToken(dataDir, given)
	if err != nil {
		return "", err
	}
	if generated {
		fmt.Fprintf(out, "\nGenerated the cluster token (kept in %s, shown only now). Start a worker with:\n\n"+
			"  skein worker --gateway http://%s --model DIR --data %s --worker-token %s\n\n",
			filepath.Join(dataDir, tokenFile), addr, dataDir, token)
	}
	return token, nil
}
