package replica

import (
	"github.com/skein-ai/skein/engine"
	"github.com/skein-ai/skein/engine/tokenizer"
)

// LocalModel is what an in-process replica has on this machine besides its compute: the model's
// directory (tokenizer, chat template and image preprocessor files) and its tokenizer. The
// gateway tokenizes text, renders chat templates and preprocesses images with them; a remote
// worker's replica has none here.
type LocalModel struct {
	Dir       string
	Tokenizer *tokenizer.Tokenizer // nil: the model has no tokenizer.json
	Config    *engine.Config
}

// Local describes the model's files on this machine; false for a remote worker's replica.
func (r *Replica) Local() (LocalModel, bool) {
	if r.local == nil {
		return LocalModel{}, false
	}
	return LocalModel{Dir: r.local.Dir, Tokenizer: r.local.Tokenizer, Config: r.local.Config}, true
}

// localEngine finds the in-process engine behind a compute: the engine itself, or a compute that
// wraps one (an instrumented engine in tests).
func localEngine(c engine.Compute) *engine.Engine {
	switch e := c.(type) {
	case *engine.Engine:
		return e
	case interface{ LocalEngine() *engine.Engine }:
		return e.LocalEngine()
	}
	return nil
}
