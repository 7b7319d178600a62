package cuda

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/ebitengine/purego"
)

// A library is one of the CUDA libraries the backend loads, by its sonames, preferred first.
type library struct {
	what  string   // for messages: "the CUDA driver", "NVRTC"
	names []string // sonames, newest first
}

var (
	libDriver   = library{"the CUDA driver", []string{"libcuda.so.1"}}
	libNVRTC    = library{"NVRTC", []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"}}
	libCublasLt = library{"cuBLASLt", []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11"}}
	libCublas   = library{"cuBLAS", []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11"}}
)

// env is what the search reads from the machine: the environment, and a root that every
// absolute system path is read under ("" or "/": the machine's own; a test's fake tree).
type env struct {
	getenv func(string) string
	root   string
	home   string
}

func osEnv() env {
	home, _ := os.UserHomeDir()
	return env{getenv: os.Getenv, root: "/", home: home}
}

// at is an absolute system path under e.root.
func (e env) at(p string) string {
	if e.root == "" || e.root == "/" {
		return p
	}
	return filepath.Join(e.root, p)
}

// glob is filepath.Glob under e.root, sorted newest-looking first (versions descending).
func (e env) glob(pattern string) []string {
	m, _ := filepath.Glob(e.at(pattern))
	sort.Slice(m, func(i, j int) bool { return versionLess(m[j], m[i]) })
	return m
}

// versionLess orders paths as versions: runs of digits compare as numbers (cuda-12.10 after
// cuda-12.9, python3.12 after python3.9).
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digits(a), digits(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digits(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}

// A searchDir is a folder the search looks in and why (for the error message).
type searchDir struct {
	dir, from string
}

// isStubs: a CUDA toolkit's stubs/ folder holds libraries of the real names that only return
// errors (link-time stand-ins); the search never looks in one.
func isStubs(dir string) bool {
	return slices.Contains(strings.Split(filepath.ToSlash(filepath.Clean(dir)), "/"), "stubs")
}

// searchDirs is every folder the search looks in, in order, once each, stubs/ folders left out:
//  1. SKEIN_CUDA_LIBS (colon-separated folders);
//  2. the loader path: LD_LIBRARY_PATH, the folders of /etc/ld.so.conf (and its includes), the
//     system's library folders (and WSL's /usr/lib/wsl/lib);
//  3. CUDA toolkits: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, /usr/local/cuda-* (newest first),
//     /opt/cuda, each its lib64 and targets/x86_64-linux/lib;
//  4. pip's wheels: nvidia/*/lib under the site-packages of $VIRTUAL_ENV, $CONDA_PREFIX, the
//     user's ~/.local, /usr/local and /usr (python3.* newest first; Debian's dist-packages too).
func searchDirs(e env) []searchDir {
	var out []searchDir
	seen := map[string]bool{}
	add := func(from string, dirs ...string) {
		for _, d := range dirs {
			if d == "" || isStubs(d) {
				continue
			}
			d = filepath.Clean(d)
			if seen[d] {
				continue
			}
			seen[d] = true
			out = append(out, searchDir{d, from})
		}
	}
	add("SKEIN_CUDA_LIBS", filepath.SplitList(e.getenv("SKEIN_CUDA_LIBS"))...)

	for _, d := range filepath.SplitList(e.getenv("LD_LIBRARY_PATH")) {
		if filepath.IsAbs(d) {
			add("LD_LIBRARY_PATH", d)
		}
	}
	for _, d := range ldSoConf(e, "/etc/ld.so.conf", 0) {
		add("/etc/ld.so.conf", e.at(d))
	}
	for _, d := range []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/lib/wsl/lib"} {
		add("system", e.at(d))
	}

	var toolkits []string
	for _, v := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if d := e.getenv(v); d != "" {
			toolkits = append(toolkits, d)
		}
	}
	toolkits = append(toolkits, e.at("/usr/local/cuda"))
	toolkits = append(toolkits, e.glob("/usr/local/cuda-*")...)
	toolkits = append(toolkits, e.at("/opt/cuda"))
	for _, t := range toolkits {
		add("CUDA toolkit", filepath.Join(t, "lib64"), filepath.Join(t, "targets", "x86_64-linux", "lib"))
	}

	var sites []string
	for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if p := e.getenv(v); p != "" {
			m, _ := filepath.Glob(filepath.Join(p, "lib", "python3*", "site-packages"))
			sort.Slice(m, func(i, j int) bool { return versionLess(m[j], m[i]) })
			sites = append(sites, m...)
		}
	}
	if e.home != "" {
		m, _ := filepath.Glob(filepath.Join(e.home, ".local", "lib", "python3*", "site-packages"))
		sort.Slice(m, func(i, j int) bool { return versionLess(m[j], m[i]) })
		sites = append(sites, m...)
	}
	for _, p := range []string{"/usr/local/lib/python3*/site-packages", "/usr/local/lib/python3*/dist-packages", "/usr/lib/python3*/site-packages", "/usr/lib/python3/dist-packages"} {
		sites = append(sites, e.glob(p)...)
	}
	for _, s := range sites {
		m, _ := filepath.Glob(filepath.Join(s, "nvidia", "*", "lib"))
		sort.Slice(m, func(i, j int) bool { return versionLess(m[j], m[i]) }) // reverse name order: cu13 before cu12
		add("pip", m...)
	}
	return out
}

// ldSoConf is the folders listed in an ld.so.conf file, following its include lines (globs,
// relative to the file's folder when not absolute).
func ldSoConf(e env, file string, depth int) []string {
	if depth > 8 {
		return nil
	}
	f, err := os.Open(e.at(file))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case line == "":
		case strings.HasPrefix(line, "include ") || strings.HasPrefix(line, "include\t"):
			pat := strings.TrimSpace(line[len("include"):])
			if !filepath.IsAbs(pat) {
				pat = filepath.Join(filepath.Dir(file), pat)
			}
			m, _ := filepath.Glob(e.at(pat))
			sort.Strings(m)
			for _, inc := range m {
				rel := inc
				if e.root != "" && e.root != "/" {
					rel, _ = filepath.Rel(e.root, inc)
					rel = "/" + rel
				}
				out = append(out, ldSoConf(e, rel, depth+1)...)
			}
		case strings.HasPrefix(line, "hwcap "):
		default:
			if filepath.IsAbs(line) {
				out = append(out, line)
			}
		}
	}
	return out
}

// findLib is the first file of lib's names in the folders, in order (within a folder, the
// newest soname first): the first folder that holds any of them decides, so SKEIN_CUDA_LIBS
// beats the machine's own. Not found: one line naming what was tried, and where.
func findLib(lib library, dirs []searchDir) (string, error) {
	for _, d := range dirs {
		for _, n := range lib.names {
			p := filepath.Join(d.dir, n)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p, nil
			}
		}
	}
	return "", notFound(lib, dirs, nil)
}

func notFound(lib library, dirs []searchDir, failed []string) error {
	groups := []struct {
		name  string
		froms []string
	}{
		{"SKEIN_CUDA_LIBS", []string{"SKEIN_CUDA_LIBS"}},
		{"the loader path", []string{"LD_LIBRARY_PATH", "/etc/ld.so.conf", "system"}},
		{"CUDA toolkits", []string{"CUDA toolkit"}},
		{"pip's nvidia/*/lib", []string{"pip"}},
	}
	var parts []string
	for _, g := range groups {
		var in []string
		for _, d := range dirs {
			if slices.Contains(g.froms, d.from) {
				in = append(in, d.dir)
			}
		}
		if len(in) == 0 {
			parts = append(parts, g.name+" (none)")
		} else {
			parts = append(parts, g.name+" ("+strings.Join(in, " ")+")")
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "cuda: %s not found: no %s in %s", lib.what, strings.Join(lib.names, ", "), strings.Join(parts, ", "))
	if len(failed) > 0 {
		fmt.Fprintf(&b, "; found but not loadable: %s", strings.Join(failed, "; "))
	}
	b.WriteString("; set SKEIN_CUDA_LIBS to the folder holding it")
	return errors.New(strings.ReplaceAll(b.String(), "\n", " "))
}

// openLib finds lib and dlopens it, trying the next candidate when one is found but does not
// load (a library of another architecture, a missing dependency).
func openLib(lib library, dirs []searchDir) (handle uintptr, path string, err error) {
	var failed []string
	for _, d := range dirs {
		for _, n := range lib.names {
			p := filepath.Join(d.dir, n)
			if st, err := os.Stat(p); err != nil || st.IsDir() {
				continue
			}
			h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
			if err != nil {
				msg := err.Error()
				if !strings.Contains(msg, p) {
					msg = p + ": " + msg
				}
				failed = append(failed, msg)
				continue
			}
			return h, p, nil
		}
	}
	return 0, "", notFound(lib, dirs, failed)
}

// Locate reports where each CUDA library would be loaded from on this machine ("" and the
// error when not found): the driver, NVRTC, cuBLASLt and cuBLAS.
func Locate() map[string]string {
	dirs := searchDirs(osEnv())
	out := map[string]string{}
	for _, l := range []library{libDriver, libNVRTC, libCublasLt, libCublas} {
		p, err := findLib(l, dirs)
		if err != nil {
			p = err.Error()
		}
		out[l.what] = p
	}
	return out
}
