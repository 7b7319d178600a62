package imageproc

import "fmt"

// Budget is what one request's images may cost together, spent as each image is loaded:
// encoded bytes (a file's size from stat, before it is read; inline and data: bytes as they
// are decoded from the body) and decoded pixels (from the header, before any decode). Limits
// bound one image; a Budget bounds their sum, so naming many images, or one image many times,
// cannot multiply memory or CPU. It also remembers the files it has read: a file named twice is
// read, counted and decoded once. A Budget serves one request and is not safe for concurrent use.
type Budget struct {
	bytes, pixels       int64 // left
	maxBytes, maxPixels int64
	files               map[string]*shared // by resolved path and format
	decodes             int
}

// shared is one file's bytes and, once decoded, its image: what every pointer to it uses.
type shared struct {
	data []byte
	info *Info  // set once the header is read and its pixels are counted
	img  *Image // set once decoded
}

// NewBudget allows maxBytes encoded bytes and maxPixels decoded pixels (width·height as
// headers state them) for one request's images.
func NewBudget(maxBytes, maxPixels int) *Budget {
	mb, mp := int64(maxBytes), int64(maxPixels)
	return &Budget{bytes: mb, pixels: mp, maxBytes: mb, maxPixels: mp, files: map[string]*shared{}}
}

// Decodes is how many images were decoded against this budget.
func (b *Budget) Decodes() int {
	if b == nil {
		return 0
	}
	return b.decodes
}

// spendBytes takes n encoded bytes, or refuses without taking any. A nil Budget allows all.
func (b *Budget) spendBytes(n int64) error {
	if b == nil {
		return nil
	}
	if n > b.bytes {
		return badImage("the request's images are over %d encoded bytes together (max_request_image_bytes); send fewer or smaller images", b.maxBytes)
	}
	b.bytes -= n
	return nil
}

// spendPixels takes an image's decoded pixels, or refuses without taking any.
func (b *Budget) spendPixels(info Info) error {
	if b == nil {
		return nil
	}
	n := int64(info.Width) * int64(info.Height)
	if n > b.pixels {
		return badImage("the request's images are over %d decoded pixels together (max_request_image_pixels): this one is %d×%d; send fewer or smaller images", b.maxPixels, info.Width, info.Height)
	}
	b.pixels -= n
	return nil
}

func (b *Budget) String() string {
	return fmt.Sprintf("%d of %d bytes, %d of %d pixels left", b.bytes, b.maxBytes, b.pixels, b.maxPixels)
}

// file is the record of a file this request has read (nil: none, or no Budget).
func (b *Budget) file(key string) *shared {
	if b == nil {
		return nil
	}
	return b.files[key]
}

// keep records a file's bytes for its other pointers (nil without a Budget).
func (b *Budget) keep(key string, data []byte) *shared {
	if b == nil {
		return nil
	}
	sh := &shared{data: data}
	b.files[key] = sh
	return sh
}
