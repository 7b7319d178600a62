package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// maxNesting bounds Sequence inside Sequence in a tokenizer.json; real files nest one level.
const maxNesting = 8

// regexTimeout stops a pathological pattern (catastrophic backtracking) from holding an encode
// forever; what it had not matched by then stays one piece.
const regexTimeout = 5 * time.Second

var errNesting = errors.New("sequences nested too deeply")

// ErrUnsupported is wrapped by Parse's error for a tokenizer.json step (or model) that this
// package does not implement: it refuses the file rather than encode differently from Hugging Face.
var ErrUnsupported = errors.New("not supported")

// step is the "type" of a tokenizer.json pipeline section; the rest is read per type.
type step struct {
	Type string `json:"type"`
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// stepType reads the type of one pipeline step; null steps are absent (""), and steps nested
// deeper than maxNesting are refused.
func stepType(raw json.RawMessage, depth int) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	if depth > maxNesting {
		return "", errNesting
	}
	var st step
	if err := json.Unmarshal(raw, &st); err != nil {
		return "", err
	}
	return st.Type, nil
}

// sequenceOf parses the steps of a Sequence (the list under key) one level deeper, leaving out
// null ones.
func sequenceOf[T comparable](raw json.RawMessage, key string, depth int, parse func(json.RawMessage, int) (T, error)) ([]T, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	var steps []json.RawMessage
	if f, ok := fields[key]; ok {
		if err := json.Unmarshal(f, &steps); err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
	}
	var zero T // a null step parses to the zero value (a nil interface)
	var seq []T
	for _, r := range steps {
		x, err := parse(r, depth+1)
		if err != nil {
			return nil, err
		}
		if x != zero {
			seq = append(seq, x)
		}
	}
	return seq, nil
}

// pattern is tokenizer.json's {"String": "..."} or {"Regex": "..."}.
type pattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func (p pattern) compile() (*regexp2.Regexp, error) {
	var expr string
	switch {
	case p.Regex != nil:
		expr = *p.Regex
	case p.String != nil:
		expr = regexp2.Escape(*p.String)
	default:
		return nil, errors.New("pattern has neither String nor Regex")
	}
	if expr == "" {
		return nil, nil // an empty pattern matches nothing (Hugging Face splits on nothing)
	}
	re, err := regexp2.Compile(expr, regexp2.Unicode)
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %w", expr, err)
	}
	re.MatchTimeout = regexTimeout
	return re, nil
}

// ---- normalizers ----

type normalizer interface{ normalize(string) string }

type normalizerSeq []normalizer

func (s normalizerSeq) normalize(x string) string {
	for _, n := range s {
		x = n.normalize(x)
	}
	return x
}

type unicodeForm struct{ form norm.Form }

func (u unicodeForm) normalize(x string) string { return u.form.String(x) }

type prepend struct{ prefix string }

// normalize prepends to non-empty text only, as Hugging Face's Prepend does.
func (p prepend) normalize(x string) string {
	if x == "" {
		return x
	}
	return p.prefix + x
}

type replace struct {
	re      *regexp2.Regexp
	content string
}

func (r replace) normalize(x string) string { return r.apply(x) }

func (r replace) apply(x string) string {
	if r.re == nil || x == "" {
		return x
	}
	out, err := r.re.Replace(x, r.content, -1, -1)
	if err != nil {
		return x
	}
	return out
}

// literalContent escapes $ so that regexp2 inserts Replace's content as written.
func literalContent(s string) string { return strings.ReplaceAll(s, "$", "$$") }

type lowercase struct{}

func (lowercase) normalize(x string) string { return strings.ToLower(x) }

type strip struct{ left, right bool }

func (s strip) normalize(x string) string {
	if s.left {
		x = strings.TrimLeftFunc(x, unicode.IsSpace)
	}
	if s.right {
		x = strings.TrimRightFunc(x, unicode.IsSpace)
	}
	return x
}

func parseNormalizer(raw json.RawMessage, depth int) (normalizer, error) {
	typ, err := stepType(raw, depth)
	if err != nil || typ == "" {
		return nil, err
	}
	switch typ {
	case "Sequence":
		seq, err := sequenceOf(raw, "normalizers", depth, parseNormalizer)
		return normalizerSeq(seq), err
	case "NFC":
		return unicodeForm{norm.NFC}, nil
	case "NFD":
		return unicodeForm{norm.NFD}, nil
	case "NFKC":
		return unicodeForm{norm.NFKC}, nil
	case "NFKD":
		return unicodeForm{norm.NFKD}, nil
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		return prepend{p.Prepend}, nil
	case "Replace":
		r, err := parseReplace(raw)
		if err != nil {
			return nil, err
		}
		return r, nil
	case "Lowercase":
		return lowercase{}, nil
	case "Strip":
		var s struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return strip{s.Left, s.Right}, nil
	}
	return nil, fmt.Errorf("normalizer %q: %w", typ, ErrUnsupported)
}

func parseReplace(raw json.RawMessage) (replace, error) {
	var r struct {
		Pattern pattern `json:"pattern"`
		Content string  `json:"content"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return replace{}, err
	}
	re, err := r.Pattern.compile()
	if err != nil {
		return replace{}, err
	}
	return replace{re: re, content: literalContent(r.Content)}, nil
}

// ---- pre-tokenizers ----

// piece is a pre-token; first says it begins the input (for Metaspace's prepend_scheme "first").
type piece struct {
	text  string
	first bool
}

type preTokenizer interface{ split([]piece) []piece }

type preTokSeq []preTokenizer

func (s preTokSeq) split(ps []piece) []piece {
	for _, p := range s {
		ps = p.split(ps)
	}
	return ps
}

// Split behaviours, named as in tokenizer.json.
const (
	behaviorRemoved            = "Removed"
	behaviorIsolated           = "Isolated"
	behaviorMergedWithPrevious = "MergedWithPrevious"
	behaviorMergedWithNext     = "MergedWithNext"
	behaviorContiguous         = "Contiguous"
)

type splitter struct {
	re       *regexp2.Regexp // nil: matches nothing
	behavior string
	invert   bool
}

// span is a stretch of a piece, in runes, and whether the pattern matched it.
type span struct {
	start, end int
	match      bool
}

func (s splitter) split(ps []piece) []piece {
	var out []piece
	for _, p := range ps {
		out = append(out, s.splitOne(p)...)
	}
	return out
}

func (s splitter) splitOne(p piece) []piece {
	runes := []rune(p.text)
	spans := s.spans(runes)
	if s.invert {
		for i := range spans {
			spans[i].match = !spans[i].match
		}
	}
	spans = applyBehavior(spans, s.behavior)
	out := make([]piece, 0, len(spans))
	for _, sp := range spans {
		if sp.end > sp.start {
			out = append(out, piece{text: string(runes[sp.start:sp.end]), first: p.first && sp.start == 0})
		}
	}
	return out
}

// spans cuts runes into alternating non-matches and matches (two matches may be adjacent). An
// empty match (a lookahead) is a split point too, except right where the previous match ended,
// as in the regex engines Hugging Face uses.
func (s splitter) spans(runes []rune) []span {
	var spans []span
	last, lastMatchEnd := 0, -1
	if s.re != nil {
		m, err := s.re.FindRunesMatch(runes)
		for err == nil && m != nil {
			if m.Length > 0 || m.Index != lastMatchEnd {
				if m.Index > last {
					spans = append(spans, span{last, m.Index, false})
				}
				spans = append(spans, span{m.Index, m.Index + m.Length, true})
				last = m.Index + m.Length
				lastMatchEnd = last
			}
			m, err = s.re.FindNextMatch(m)
		}
	}
	if last < len(runes) {
		spans = append(spans, span{last, len(runes), false})
	}
	return spans
}

// applyBehavior joins or drops matched spans as Hugging Face's SplitDelimiterBehavior does; the
// results are plain pieces.
func applyBehavior(spans []span, behavior string) []span {
	var out []span
	switch behavior {
	case behaviorRemoved:
		for _, sp := range spans {
			if !sp.match {
				out = append(out, sp)
			}
		}
	case behaviorMergedWithPrevious:
		prevMatch := false
		for _, sp := range spans {
			if sp.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prevMatch = sp.match
		}
	case behaviorMergedWithNext:
		prevMatch := false // walking backwards: whether the span after this one matched
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = sp.start
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prevMatch = sp.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	case behaviorContiguous:
		prevMatch := false
		for _, sp := range spans {
			if sp.match == prevMatch && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prevMatch = sp.match
		}
	default: // Isolated
		out = spans
	}
	return out
}

// byteLevel maps each piece's UTF-8 bytes to GPT-2's printable characters, optionally first adding
// a space and splitting with GPT-2's pattern.
type byteLevel struct {
	prefixSpace bool
	re          *splitter
}

func (b byteLevel) split(ps []piece) []piece {
	if b.prefixSpace {
		for i := range ps {
			if !strings.HasPrefix(ps[i].text, " ") {
				ps[i].text = " " + ps[i].text
			}
		}
	}
	if b.re != nil {
		ps = b.re.split(ps)
	}
	for i := range ps {
		var sb strings.Builder
		for j := 0; j < len(ps[i].text); j++ {
			sb.WriteRune(byteToRune[ps[i].text[j]])
		}
		ps[i].text = sb.String()
	}
	return ps
}

// metaspace replaces spaces with the replacement character (▁), prepends one per its scheme and
// optionally splits before each ▁.
type metaspace struct {
	replacement string
	scheme      string // always, first, never
	splitAt     *splitter
}

func (m metaspace) split(ps []piece) []piece {
	var out []piece
	for _, p := range ps {
		p.text = strings.ReplaceAll(p.text, " ", m.replacement)
		if !strings.HasPrefix(p.text, m.replacement) && (m.scheme == "always" || m.scheme == "first" && p.first) {
			p.text = m.replacement + p.text
		}
		if m.splitAt != nil {
			out = append(out, m.splitAt.splitOne(p)...)
		} else {
			out = append(out, p)
		}
	}
	return out
}

// metaspaceConfig is Metaspace's tokenizer.json form, old (add_prefix_space) or new (prepend_scheme).
type metaspaceConfig struct {
	Replacement    string  `json:"replacement"`
	AddPrefixSpace *bool   `json:"add_prefix_space"`
	PrependScheme  *string `json:"prepend_scheme"`
	Split          *bool   `json:"split"`
}

// scheme resolves the prepend scheme as Hugging Face does: add_prefix_space false means never,
// otherwise prepend_scheme, by default always.
func (c metaspaceConfig) scheme() (string, error) {
	if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
		return "never", nil
	}
	if c.PrependScheme == nil {
		return "always", nil
	}
	switch *c.PrependScheme {
	case "always", "first", "never":
		return *c.PrependScheme, nil
	}
	return "", fmt.Errorf("metaspace prepend_scheme %q", *c.PrependScheme)
}

func parseMetaspace(raw json.RawMessage) (metaspaceConfig, string, error) {
	var c metaspaceConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, "", err
	}
	if c.Replacement == "" {
		c.Replacement = "\u2581"
	}
	scheme, err := c.scheme()
	return c, scheme, err
}

func parsePreTokenizer(raw json.RawMessage, depth int) (preTokenizer, error) {
	typ, err := stepType(raw, depth)
	if err != nil || typ == "" {
		return nil, err
	}
	switch typ {
	case "Sequence":
		seq, err := sequenceOf(raw, "pretokenizers", depth, parsePreTokenizer)
		return preTokSeq(seq), err
	case "Split":
		var s struct {
			Pattern  pattern `json:"pattern"`
			Behavior string  `json:"behavior"`
			Invert   bool    `json:"invert"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		switch s.Behavior {
		case behaviorRemoved, behaviorIsolated, behaviorMergedWithPrevious, behaviorMergedWithNext, behaviorContiguous:
		default:
			return nil, fmt.Errorf("split behavior %q: %w", s.Behavior, ErrUnsupported)
		}
		re, err := s.Pattern.compile()
		if err != nil {
			return nil, err
		}
		return splitter{re: re, behavior: s.Behavior, invert: s.Invert}, nil
	case "ByteLevel":
		var b struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, err
		}
		bl := byteLevel{prefixSpace: b.AddPrefixSpace}
		if b.UseRegex == nil || *b.UseRegex {
			re := regexp2.MustCompile(gpt2Pattern, regexp2.Unicode)
			re.MatchTimeout = regexTimeout
			bl.re = &splitter{re: re, behavior: behaviorIsolated}
		}
		return bl, nil
	case "Metaspace":
		c, scheme, err := parseMetaspace(raw)
		if err != nil {
			return nil, err
		}
		m := metaspace{replacement: c.Replacement, scheme: scheme}
		if c.Split == nil || *c.Split {
			re, err := pattern{String: &c.Replacement}.compile()
			if err != nil {
				return nil, err
			}
			m.splitAt = &splitter{re: re, behavior: behaviorMergedWithNext}
		}
		return m, nil
	case "Digits":
		var d struct {
			Individual bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, err
		}
		re := regexp2.MustCompile(`\p{N}`, regexp2.Unicode)
		re.MatchTimeout = regexTimeout
		if d.Individual {
			return splitter{re: re, behavior: behaviorIsolated}, nil
		}
		return splitter{re: re, behavior: behaviorContiguous}, nil
	case "WhitespaceSplit":
		re := regexp2.MustCompile(`\s+`, regexp2.Unicode)
		re.MatchTimeout = regexTimeout
		return splitter{re: re, behavior: behaviorRemoved}, nil
	}
	return nil, fmt.Errorf("pre-tokenizer %q: %w", typ, ErrUnsupported)
}
