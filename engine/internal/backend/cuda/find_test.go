package cuda

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeTree makes files (paths relative to a fresh root; "ROOT" in contents is that root) and
// returns the root.
func fakeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(strings.ReplaceAll(content, "ROOT", root)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func fakeEnv(root string, vars map[string]string) env {
	return env{
		getenv: func(k string) string { return strings.ReplaceAll(vars[k], "ROOT", root) },
		root:   root,
		home:   filepath.Join(root, "home/u"),
	}
}

// TestFindLibOrder: the search order, on fake folders: SKEIN_CUDA_LIBS first, then the loader
// path (LD_LIBRARY_PATH, ld.so.conf and its includes, the system folders), CUDA toolkits
// (newest first; lib64, targets/x86_64-linux/lib), pip's nvidia/*/lib; stubs/ never; within a
// folder the newest soname.
func TestFindLibOrder(t *testing.T) {
	const toolkitStub = "usr/local/cuda/targets/x86_64-linux/lib/stubs/"
	for _, tc := range []struct {
		name  string
		lib   library
		files map[string]string
		vars  map[string]string
		want  string // relative to the root; "" = not found
	}{
		{
			name: "SKEIN_CUDA_LIBS first, even over a newer version elsewhere",
			lib:  libNVRTC,
			files: map[string]string{
				"custom/libnvrtc.so.11.2":                 "",
				"usr/lib/x86_64-linux-gnu/libnvrtc.so.12": "",
				"usr/local/cuda/lib64/libnvrtc.so.13":     "",
				"elsewhere/libnvrtc.so.13":                "",
			},
			vars: map[string]string{"SKEIN_CUDA_LIBS": "ROOT/nothing-here:ROOT/custom"},
			want: "custom/libnvrtc.so.11.2",
		},
		{
			name: "newest soname within a folder",
			lib:  libNVRTC,
			files: map[string]string{
				"usr/lib/x86_64-linux-gnu/libnvrtc.so.11.2": "",
				"usr/lib/x86_64-linux-gnu/libnvrtc.so.12":   "",
			},
			want: "usr/lib/x86_64-linux-gnu/libnvrtc.so.12",
		},
		{
			name: "loader path before a toolkit",
			lib:  libDriver,
			files: map[string]string{
				"usr/lib/x86_64-linux-gnu/libcuda.so.1": "",
				"usr/local/cuda/lib64/libcuda.so.1":     "",
			},
			want: "usr/lib/x86_64-linux-gnu/libcuda.so.1",
		},
		{
			name: "LD_LIBRARY_PATH before the system folders, its stubs/ skipped",
			lib:  libCublas,
			files: map[string]string{
				"ld/stubs/libcublas.so.13":                 "",
				"ld/real/libcublas.so.12":                  "",
				"usr/lib/x86_64-linux-gnu/libcublas.so.13": "",
			},
			vars: map[string]string{"LD_LIBRARY_PATH": "ROOT/ld/stubs:ROOT/ld/real"},
			want: "ld/real/libcublas.so.12",
		},
		{
			name: "ld.so.conf and its includes",
			lib:  libDriver,
			files: map[string]string{
				"etc/ld.so.conf":                        "# comment\ninclude /etc/ld.so.conf.d/*.conf\n",
				"etc/ld.so.conf.d/nvidia.conf":          "/opt/nvidia/lib\n",
				"opt/nvidia/lib/libcuda.so.1":           "",
				"usr/lib/x86_64-linux-gnu/libcuda.so.1": "",
			},
			want: "opt/nvidia/lib/libcuda.so.1",
		},
		{
			name: "a toolkit's stubs/ skipped for its targets/x86_64-linux/lib",
			lib:  libNVRTC,
			files: map[string]string{
				toolkitStub + "libnvrtc.so.13":                           "",
				"usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.12": "",
			},
			want: "usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.12",
		},
		{
			name: "only a stub: not found",
			lib:  libNVRTC,
			files: map[string]string{
				toolkitStub + "libnvrtc.so.12": "",
			},
			vars: map[string]string{"SKEIN_CUDA_LIBS": "ROOT/" + toolkitStub},
			want: "",
		},
		{
			name: "CUDA_HOME, then /usr/local/cuda, then cuda-* newest first",
			lib:  libCublasLt,
			files: map[string]string{
				"usr/local/cuda-12.9/lib64/libcublasLt.so.12":  "",
				"usr/local/cuda-12.10/lib64/libcublasLt.so.12": "",
				"usr/local/cuda-11.8/lib64/libcublasLt.so.11":  "",
			},
			want: "usr/local/cuda-12.10/lib64/libcublasLt.so.12",
		},
		{
			name: "CUDA_HOME first among toolkits",
			lib:  libCublasLt,
			files: map[string]string{
				"usr/local/cuda/lib64/libcublasLt.so.13": "",
				"mycuda/lib64/libcublasLt.so.12":         "",
			},
			vars: map[string]string{"CUDA_HOME": "ROOT/mycuda"},
			want: "mycuda/lib64/libcublasLt.so.12",
		},
		{
			name: "a toolkit before pip",
			lib:  libNVRTC,
			files: map[string]string{
				"usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.12":                "",
				"usr/local/lib/python3.12/dist-packages/nvidia/cu13/lib/libnvrtc.so.13": "",
			},
			want: "usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.12",
		},
		{
			name: "pip: the virtualenv, then ~/.local, then /usr/local (python3.* newest first)",
			lib:  libNVRTC,
			files: map[string]string{
				"home/u/.local/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12": "",
				"venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13":                "",
				"usr/local/lib/python3.12/dist-packages/nvidia/cu13/lib/libnvrtc.so.13":           "",
			},
			vars: map[string]string{"VIRTUAL_ENV": "ROOT/venv"},
			want: "venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
		},
		{
			name: "pip: ~/.local when no virtualenv",
			lib:  libNVRTC,
			files: map[string]string{
				"home/u/.local/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12": "",
				"usr/local/lib/python3.10/site-packages/nvidia/cu13/lib/libnvrtc.so.13":           "",
			},
			want: "home/u/.local/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
		},
		{
			name: "pip: /usr/local's newest python first",
			lib:  libCublas,
			files: map[string]string{
				"usr/local/lib/python3.9/site-packages/nvidia/cublas/lib/libcublas.so.12":  "",
				"usr/local/lib/python3.12/site-packages/nvidia/cublas/lib/libcublas.so.12": "",
			},
			want: "usr/local/lib/python3.12/site-packages/nvidia/cublas/lib/libcublas.so.12",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeTree(t, tc.files)
			dirs := searchDirs(fakeEnv(root, tc.vars))
			for _, d := range dirs {
				if isStubs(d.dir) {
					t.Errorf("searchDirs lists a stubs folder: %s", d.dir)
				}
			}
			got, err := findLib(tc.lib, dirs)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("found %s, want not found", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(root, tc.want); got != want {
				t.Errorf("found %s\nwant  %s", got, want)
			}
		})
	}
}

// TestSearchDirsOrder: the folders' order by where they come from.
func TestSearchDirsOrder(t *testing.T) {
	root := fakeTree(t, map[string]string{
		"etc/ld.so.conf":                                      "/opt/conf/lib\n",
		"usr/local/cuda-12.4/lib64/x":                         "",
		"venv/lib/python3.12/site-packages/nvidia/cu13/lib/x": "",
	})
	dirs := searchDirs(fakeEnv(root, map[string]string{
		"SKEIN_CUDA_LIBS": "ROOT/a:ROOT/b/stubs:ROOT/c",
		"LD_LIBRARY_PATH": "ROOT/ld:relative/ignored",
		"VIRTUAL_ENV":     "ROOT/venv",
	}))
	var got []string
	for _, d := range dirs {
		got = append(got, d.from+" "+strings.TrimPrefix(d.dir, root))
	}
	want := []string{
		"SKEIN_CUDA_LIBS /a", "SKEIN_CUDA_LIBS /c",
		"LD_LIBRARY_PATH /ld",
		"/etc/ld.so.conf /opt/conf/lib",
		"system /lib/x86_64-linux-gnu", "system /usr/lib/x86_64-linux-gnu", "system /lib64", "system /usr/lib64", "system /lib", "system /usr/lib", "system /usr/lib/wsl/lib",
		"CUDA toolkit /usr/local/cuda/lib64", "CUDA toolkit /usr/local/cuda/targets/x86_64-linux/lib",
		"CUDA toolkit /usr/local/cuda-12.4/lib64", "CUDA toolkit /usr/local/cuda-12.4/targets/x86_64-linux/lib",
		"CUDA toolkit /opt/cuda/lib64", "CUDA toolkit /opt/cuda/targets/x86_64-linux/lib",
		"pip /venv/lib/python3.12/site-packages/nvidia/cu13/lib",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("searchDirs:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestLibNotFound: a missing library is one error line naming the sonames tried and where.
func TestLibNotFound(t *testing.T) {
	root := fakeTree(t, map[string]string{"usr/local/cuda/targets/x86_64-linux/lib/stubs/libnvrtc.so.12": ""})
	dirs := searchDirs(fakeEnv(root, nil))
	_, err := findLib(libNVRTC, dirs)
	if err == nil {
		t.Fatal("found NVRTC in a tree holding only a stub")
	}
	msg := err.Error()
	t.Log(msg)
	if strings.Contains(msg, "\n") {
		t.Errorf("error spans lines: %q", msg)
	}
	for _, s := range []string{"NVRTC not found", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "SKEIN_CUDA_LIBS (none)", "the loader path (", "/usr/local/cuda/targets/x86_64-linux/lib", "pip"} {
		if !strings.Contains(msg, s) {
			t.Errorf("error lacks %q: %s", s, msg)
		}
	}
}

// TestOpenLibNotLoadable: a file of the right name that is no library is reported, and the
// search ends in an error, not a panic; loading the driver and NVRTC from it fails the same way.
func TestOpenLibNotLoadable(t *testing.T) {
	root := fakeTree(t, map[string]string{
		"bad/libcuda.so.1":   "not an ELF file",
		"bad/libnvrtc.so.12": "not an ELF file",
	})
	dirs := []searchDir{{filepath.Join(root, "bad"), "SKEIN_CUDA_LIBS"}}
	if _, err := loadDriver(dirs); err == nil || !strings.Contains(err.Error(), "not loadable") {
		t.Errorf("loadDriver of a non-library: %v", err)
	} else {
		t.Log(err)
	}
	if _, err := loadNVRTC(dirs); err == nil || !strings.Contains(err.Error(), "not loadable") {
		t.Errorf("loadNVRTC of a non-library: %v", err)
	}
}

func TestVersionLess(t *testing.T) {
	for _, c := range [][2]string{{"cuda-12.9", "cuda-12.10"}, {"python3.9", "python3.12"}, {"cu12", "cu13"}, {"a", "b"}, {"a1", "a1x"}} {
		if !versionLess(c[0], c[1]) || versionLess(c[1], c[0]) {
			t.Errorf("versionLess(%q, %q) wrong", c[0], c[1])
		}
	}
}
