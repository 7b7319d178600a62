package router

// Weights are the scorers' weights in the default pipeline; zero keeps the default.
type Weights struct {
	Capacity, QueueDepth, Held float64
}

// DefaultWeights favour capacity tier first, then balance, then queue depth.
var DefaultWeights = Weights{Capacity: 4, QueueDepth: 1, Held: 2}
