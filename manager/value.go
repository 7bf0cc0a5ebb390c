package manager

import (
	"bytes"
	"fmt"
	"math"
)

// typecode describes one Value typecode.
type typecode struct {
	class byte // 'i' signed, 'u' unsigned, 'f' float, '?' bool, 'c' char, 'O' opaque
	bits  uint
}

var typecodes = map[string]typecode{
	"b": {'i', 8}, "B": {'u', 8}, "h": {'i', 16}, "H": {'u', 16},
	"i": {'i', 32}, "I": {'u', 32}, "l": {'i', 64}, "L": {'u', 64},
	"q": {'i', 64}, "Q": {'u', 64},
	"f": {'f', 32}, "d": {'f', 64},
	"?": {'?', 0}, "c": {'c', 0}, "O": {'O', 0},
}

// Value is a single typed value, as multiprocessing's Value, with atomic add
// and compare-and-set for numeric typecodes. It holds int64, uint64, float64,
// bool or []byte according to its typecode.
//
// A numeric value (every typecode but 'c' and 'O') lives in a ValueCell,
// which fast-path clients change by atomic store and compare-and-swap
// without the daemon: the op semantics read it through load and change it
// with store or a CAS loop (Add, CompareAndSet). The decoded value is cached
// with the bits it came from, so a read allocates nothing unless the cell
// changed.
type Value struct {
	base
	code      string
	tc        typecode
	cell      ValueCell
	cache     any    // the value; for 'c' and 'O' the only copy
	cacheBits uint64 // the cell's bits cache was decoded from
	cached    bool
}

// numeric reports whether the value lives in the cell.
func (v *Value) numeric() bool { return v.tc.class != 'c' && v.tc.class != 'O' }

// Cell returns the value cell of a numeric Value, or nil.
func (v *Value) Cell() *ValueCell {
	if !v.numeric() {
		return nil
	}
	return &v.cell
}

// load returns the current value; call with v.mu held.
func (v *Value) load() any {
	if !v.numeric() {
		return v.cache
	}
	bits := v.cell.Bits.Load()
	if !v.cached || bits != v.cacheBits {
		v.cache, v.cacheBits, v.cached = fromBits(v.tc.class, bits), bits, true
	}
	return v.cache
}

// store replaces the value (in canonical form); call with v.mu held.
func (v *Value) store(x any) {
	if v.numeric() {
		v.cacheBits, v.cached = toBits(v.tc.class, x), true
		v.cell.Write(v.cacheBits)
	}
	v.cache = x
}

func newValue(name, code string, initial any) (*Value, error) {
	tc, ok := typecodes[code]
	if !ok {
		return nil, fmt.Errorf("%w: unknown typecode %q (use one of b B h H i I l L q Q f d ? c O)", ErrValue, code)
	}
	v := &Value{base: base{name: name}, code: code, tc: tc}
	if initial == nil {
		initial = v.zero()
	}
	c, err := v.convert(initial)
	if err != nil {
		return nil, err
	}
	v.store(c)
	return v, nil
}

// Kind implements Object.
func (v *Value) Kind() Kind { return KindValue }

// Typecode returns the value's typecode.
func (v *Value) Typecode() string { return v.code }

func (v *Value) zero() any {
	switch v.tc.class {
	case 'i':
		return int64(0)
	case 'u':
		return uint64(0)
	case 'f':
		return float64(0)
	case '?':
		return false
	case 'c':
		return []byte{0}
	default:
		return []byte{}
	}
}

// convert checks x against the typecode and returns it in canonical form.
func (v *Value) convert(x any) (any, error) {
	switch v.tc.class {
	case 'i':
		var n int64
		switch t := x.(type) {
		case int64:
			n = t
		case uint64:
			if t > math.MaxInt64 {
				return nil, v.rangeErr(x)
			}
			n = int64(t)
		default:
			return nil, v.typeErr(x)
		}
		if v.tc.bits < 64 {
			lim := int64(1) << (v.tc.bits - 1)
			if n < -lim || n >= lim {
				return nil, v.rangeErr(x)
			}
		}
		return n, nil
	case 'u':
		var n uint64
		switch t := x.(type) {
		case int64:
			if t < 0 {
				return nil, v.rangeErr(x)
			}
			n = uint64(t)
		case uint64:
			n = t
		default:
			return nil, v.typeErr(x)
		}
		if v.tc.bits < 64 && n >= uint64(1)<<v.tc.bits {
			return nil, v.rangeErr(x)
		}
		return n, nil
	case 'f':
		var f float64
		switch t := x.(type) {
		case float64:
			f = t
		case int64:
			f = float64(t)
		case uint64:
			f = float64(t)
		default:
			return nil, v.typeErr(x)
		}
		if v.tc.bits == 32 {
			f = float64(float32(f))
		}
		return f, nil
	case '?':
		switch t := x.(type) {
		case bool:
			return t, nil
		case int64:
			return t != 0, nil
		case uint64:
			return t != 0, nil
		}
		return nil, v.typeErr(x)
	case 'c':
		if b, ok := x.([]byte); ok && len(b) == 1 {
			return b, nil
		}
		return nil, fmt.Errorf("%w: typecode 'c' holds exactly one byte", ErrType)
	default:
		if b, ok := x.([]byte); ok {
			return b, nil
		}
		return nil, v.typeErr(x)
	}
}

func (v *Value) rangeErr(x any) error {
	return fmt.Errorf("%w: %v is out of range for typecode %q", ErrValue, x, v.code)
}

func (v *Value) typeErr(x any) error {
	return fmt.Errorf("%w: a %T cannot be stored in a value of typecode %q", ErrType, x, v.code)
}

// Get returns the value.
func (v *Value) Get() any {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.load()
}

// Set replaces the value.
func (v *Value) Set(x any) error {
	c, err := v.convert(x)
	if err != nil {
		return err
	}
	v.mu.Lock()
	v.store(c)
	v.mu.Unlock()
	return nil
}

// Add adds delta atomically and returns the new value. Integers wrap around
// at their typecode's width, as C arithmetic does. The cell may be shared
// with fast-path clients, so the change is a CAS loop on its bits.
func (v *Value) Add(delta any) (any, error) {
	var next func(old uint64) uint64
	switch v.tc.class {
	case 'i', 'u':
		var d uint64
		switch t := delta.(type) {
		case int64:
			d = uint64(t)
		case uint64:
			d = t
		default:
			return nil, fmt.Errorf("%w: add to an integer value takes an integer delta", ErrType)
		}
		next = func(old uint64) uint64 { return toBits(v.tc.class, v.wrap(old+d)) }
	case 'f':
		var d float64
		switch t := delta.(type) {
		case float64:
			d = t
		case int64:
			d = float64(t)
		case uint64:
			d = float64(t)
		default:
			return nil, fmt.Errorf("%w: delta must be a number", ErrType)
		}
		next = func(old uint64) uint64 {
			f := math.Float64frombits(old) + d
			if v.tc.bits == 32 {
				f = float64(float32(f))
			}
			return math.Float64bits(f)
		}
	default:
		return nil, fmt.Errorf("%w: add needs an integer or float typecode, not %q", ErrType, v.code)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for {
		old := v.cell.Bits.Load()
		n := next(old)
		if v.cell.Bits.CompareAndSwap(old, n) {
			v.cell.Seq.Store(v.cell.Seq.Load() + 2)
			return fromBits(v.tc.class, n), nil
		}
	}
}

// wrap truncates n to the typecode's width and sign-extends signed codes.
func (v *Value) wrap(n uint64) any {
	bits := v.tc.bits
	if bits < 64 {
		n &= (uint64(1) << bits) - 1
	}
	if v.tc.class == 'u' {
		return n
	}
	shift := 64 - bits
	return int64(n<<shift) >> shift
}

// CompareAndSet replaces the value with next if it equals expected.
func (v *Value) CompareAndSet(expected, next any) (bool, error) {
	e, err := v.convert(expected)
	if err != nil {
		return false, err
	}
	n, err := v.convert(next)
	if err != nil {
		return false, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.numeric() {
		if !equal(v.load(), e) {
			return false, nil
		}
		v.store(n)
		return true, nil
	}
	nb := toBits(v.tc.class, n)
	for {
		old := v.cell.Bits.Load()
		if !equal(fromBits(v.tc.class, old), e) {
			return false, nil
		}
		if v.cell.Bits.CompareAndSwap(old, nb) {
			v.cell.Seq.Store(v.cell.Seq.Load() + 2)
			return true, nil
		}
	}
}

func equal(a, b any) bool {
	if x, ok := a.([]byte); ok {
		y, ok := b.([]byte)
		return ok && bytes.Equal(x, y)
	}
	return a == b
}

// Describe implements Object.
func (v *Value) Describe() (string, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if b, ok := v.load().([]byte); ok && v.tc.class == 'O' {
		return fmt.Sprintf("%s: %d bytes", v.code, len(b)), 0
	}
	return fmt.Sprintf("%s: %v", v.code, v.load()), 0
}

func (v *Value) fail(err error) {
	v.mu.Lock()
	v.dead = err
	v.mu.Unlock()
}
