package engine

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
)

// GoMLX v0.28.2's DotGeneral gradient always ends with a Transpose back to the input's axis
// order, even when that order is already right (the usual case for x·W). The Go backend then
// copies the whole activation gradient element by element: about a second per training step on
// the small preset. This wraps the registered VJP and drops transposes whose permutation is the
// identity. The gradient checks (finite differences, square and non-square weights) cover it.
func init() {
	original := graph.VJPRegistration[graph.NodeTypeDotGeneral]
	if original == nil {
		return
	}
	graph.VJPRegistration[graph.NodeTypeDotGeneral] = func(node *graph.Node, vjps []*graph.Node, outputShape shapes.Shape) []*graph.Node {
		grads := original(node, vjps, outputShape)
		for i, g := range grads {
			if g != nil && g.Type() == graph.NodeTypeTranspose && isIdentityTranspose(g) {
				grads[i] = g.Inputs()[0]
			}
		}
		return grads
	}
}

var permutationRe = regexp.MustCompile(`permutation=\[([0-9 ]*)\]`)

// isIdentityTranspose reads a Transpose node's permutation (GoMLX does not export it) from its
// description and reports whether it is 0, 1, 2, …
func isIdentityTranspose(n *graph.Node) bool {
	m := permutationRe.FindStringSubmatch(n.String())
	if m == nil {
		return false
	}
	fields := strings.Fields(m[1])
	if len(fields) != n.Rank() {
		return false
	}
	for i, f := range fields {
		if v, err := strconv.Atoi(f); err != nil || v != i {
			return false
		}
	}
	return true
}
