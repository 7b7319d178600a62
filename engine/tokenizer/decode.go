package tokenizer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ---- post-processors ----

// postProcessor is what a single sequence gets around it with add_special_tokens.
type postProcessor struct{ prefix, suffix []int }

func parsePostProcessor(raw json.RawMessage, depth int) (postProcessor, error) {
	if isNull(raw) {
		return postProcessor{}, nil
	}
	if depth > maxNesting {
		return postProcessor{}, errNesting
	}
	var st step
	if err := json.Unmarshal(raw, &st); err != nil {
		return postProcessor{}, err
	}
	switch st.Type {
	case "ByteLevel":
		return postProcessor{}, nil // offsets only; ids unchanged
	case "Sequence":
		var s struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return postProcessor{}, err
		}
		var pp postProcessor
		for _, r := range s.Processors {
			p, err := parsePostProcessor(r, depth+1)
			if err != nil {
				return postProcessor{}, err
			}
			// each processor wraps the previous one's output
			pp.prefix = append(append([]int{}, p.prefix...), pp.prefix...)
			pp.suffix = append(pp.suffix, p.suffix...)
		}
		return pp, nil
	case "TemplateProcessing":
		return parseTemplate(raw)
	case "BertProcessing", "RobertaProcessing":
		var b struct {
			Cls []any `json:"cls"`
			Sep []any `json:"sep"`
		}
		if err := json.Unmarshal(raw, &b); err != nil {
			return postProcessor{}, err
		}
		cls, err := pairID(b.Cls)
		if err != nil {
			return postProcessor{}, fmt.Errorf("cls: %w", err)
		}
		sep, err := pairID(b.Sep)
		if err != nil {
			return postProcessor{}, fmt.Errorf("sep: %w", err)
		}
		return postProcessor{prefix: []int{cls}, suffix: []int{sep}}, nil
	}
	return postProcessor{}, fmt.Errorf("post-processor %q: %w", st.Type, ErrUnsupported)
}

// pairID reads the id of a ["[CLS]", 101] pair.
func pairID(p []any) (int, error) {
	if len(p) != 2 {
		return 0, fmt.Errorf("want [token, id], got %d items", len(p))
	}
	f, ok := p[1].(float64)
	if !ok || f < 0 || f >= MaxVocab || f != float64(int(f)) {
		return 0, fmt.Errorf("bad id %v", p[1])
	}
	return int(f), nil
}

func parseTemplate(raw json.RawMessage) (postProcessor, error) {
	var t struct {
		Single []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return postProcessor{}, err
	}
	var pp postProcessor
	seen := false
	for _, item := range t.Single {
		switch {
		case item.Sequence != nil:
			if seen {
				return postProcessor{}, fmt.Errorf("template: sequence twice in single")
			}
			seen = true
		case item.SpecialToken != nil:
			st, ok := t.SpecialTokens[item.SpecialToken.ID]
			if !ok {
				return postProcessor{}, fmt.Errorf("template: special token %q not in special_tokens", item.SpecialToken.ID)
			}
			for _, id := range st.IDs {
				if id < 0 || id >= MaxVocab {
					return postProcessor{}, fmt.Errorf("template: special token %q: bad id %d", item.SpecialToken.ID, id)
				}
			}
			if seen {
				pp.suffix = append(pp.suffix, st.IDs...)
			} else {
				pp.prefix = append(pp.prefix, st.IDs...)
			}
		}
	}
	return pp, nil
}

// ---- decoders ----

// decoder turns token strings into text, chain-wise as Hugging Face's decode_chain does.
type decoder interface{ decode([]string) []string }

type decoderSeq []decoder

func (s decoderSeq) decode(toks []string) []string {
	for _, d := range s {
		toks = d.decode(toks)
	}
	return toks
}

// byteLevelDecoder maps GPT-2 characters back to bytes. A token holding a character outside the
// map (an added token such as <｜begin▁of▁sentence｜>) is kept as written. Bytes are joined as
// they are, so text cut mid-character keeps its partial UTF-8 (stop strings match on bytes).
type byteLevelDecoder struct{}

func (byteLevelDecoder) decode(toks []string) []string {
	var buf []byte
	for _, t := range toks {
		start := len(buf)
		ok := true
		for _, r := range t {
			b, in := runeToByte[r]
			if !in {
				ok = false
				break
			}
			buf = append(buf, b)
		}
		if !ok {
			buf = append(buf[:start], t...)
		}
	}
	return []string{string(buf)}
}

type replaceDecoder struct{ r replace }

func (d replaceDecoder) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = d.r.apply(t)
	}
	return out
}

// byteFallbackDecoder turns runs of <0xNN> tokens into the text their bytes spell; a run that is
// not valid UTF-8 becomes one U+FFFD per token, as Hugging Face does.
type byteFallbackDecoder struct{}

func byteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(t[3:5], 16, 8)
	return byte(v), err == nil
}

func (byteFallbackDecoder) decode(toks []string) []string {
	out := make([]string, 0, len(toks))
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, t := range toks {
		if b, ok := byteToken(t); ok {
			run = append(run, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDecoder struct{}

func (fuseDecoder) decode(toks []string) []string { return []string{strings.Join(toks, "")} }

// stripDecoder removes up to start leading and stop trailing content characters from each token.
type stripDecoder struct {
	content     rune
	start, stop int
}

func (d stripDecoder) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		for n := 0; n < d.start; n++ {
			r, size := utf8.DecodeRuneInString(t)
			if size == 0 || r != d.content {
				break
			}
			t = t[size:]
		}
		for n := 0; n < d.stop; n++ {
			r, size := utf8.DecodeLastRuneInString(t)
			if size == 0 || r != d.content {
				break
			}
			t = t[:len(t)-size]
		}
		out[i] = t
	}
	return out
}

// metaspaceDecoder turns ▁ into spaces; in the first token, unless the scheme is never, every ▁
// is dropped (Hugging Face's rule, which transformers.js simplifies to one leading space).
type metaspaceDecoder struct {
	replacement rune
	dropFirst   bool
}

func (d metaspaceDecoder) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		var sb strings.Builder
		for _, r := range t {
			switch {
			case r != d.replacement:
				sb.WriteRune(r)
			case i == 0 && d.dropFirst:
			default:
				sb.WriteByte(' ')
			}
		}
		out[i] = sb.String()
	}
	return out
}

func parseDecoder(raw json.RawMessage, depth int) (decoder, error) {
	typ, err := stepType(raw, depth)
	if err != nil || typ == "" {
		return nil, err
	}
	switch typ {
	case "Sequence":
		seq, err := sequenceOf(raw, "decoders", depth, parseDecoder)
		return decoderSeq(seq), err
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "Replace":
		r, err := parseReplace(raw)
		if err != nil {
			return nil, err
		}
		return replaceDecoder{r}, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Strip":
		var s struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		r, size := utf8.DecodeRuneInString(s.Content)
		if size == 0 || size != len(s.Content) {
			return nil, fmt.Errorf("strip content %q: want one character", s.Content)
		}
		if s.Start < 0 || s.Stop < 0 || s.Start > 1024 || s.Stop > 1024 {
			return nil, fmt.Errorf("strip start %d / stop %d outside [0, 1024]", s.Start, s.Stop)
		}
		return stripDecoder{content: r, start: s.Start, stop: s.Stop}, nil
	case "Metaspace":
		c, scheme, err := parseMetaspace(raw)
		if err != nil {
			return nil, err
		}
		r, size := utf8.DecodeRuneInString(c.Replacement)
		if size != len(c.Replacement) {
			return nil, fmt.Errorf("metaspace replacement %q: want one character", c.Replacement)
		}
		return metaspaceDecoder{replacement: r, dropFirst: scheme != "never"}, nil
	}
	return nil, fmt.Errorf("decoder %q: %w", typ, ErrUnsupported)
}
