package manager

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"testing"
)

// f01 is 0.1 rounded to float32, as a variable so that arithmetic on it
// happens at run time, in float64, like the server's.
var f01, d01 = float64(float32(0.1)), 0.1

func newTestValue(t *testing.T, code string, initial any) *Value {
	t.Helper()
	v, err := newValue("v", code, initial)
	if err != nil {
		t.Fatalf("newValue(%q, %v): %v", code, initial, err)
	}
	return v
}

func TestValueTypecodes(t *testing.T) {
	type check struct {
		in   any
		want any   // stored value when err is nil
		err  error // ErrValue or ErrType
	}
	tests := []struct {
		code   string
		zero   any
		checks []check
	}{
		{"b", int64(0), []check{
			{int64(-128), int64(-128), nil}, {int64(127), int64(127), nil}, {uint64(5), int64(5), nil},
			{int64(128), nil, ErrValue}, {int64(-129), nil, ErrValue}, {uint64(math.MaxUint64), nil, ErrValue},
			{1.0, nil, ErrType}, {"1", nil, ErrType}, {true, nil, ErrType}, {nil, nil, ErrType}, {[]byte{1}, nil, ErrType},
		}},
		{"B", uint64(0), []check{
			{int64(0), uint64(0), nil}, {int64(255), uint64(255), nil}, {uint64(255), uint64(255), nil},
			{int64(256), nil, ErrValue}, {int64(-1), nil, ErrValue}, {2.0, nil, ErrType},
		}},
		{"h", int64(0), []check{
			{int64(-32768), int64(-32768), nil}, {int64(32767), int64(32767), nil},
			{int64(32768), nil, ErrValue}, {int64(-32769), nil, ErrValue},
		}},
		{"H", uint64(0), []check{
			{int64(65535), uint64(65535), nil}, {int64(65536), nil, ErrValue}, {int64(-1), nil, ErrValue},
		}},
		{"i", int64(0), []check{
			{int64(math.MinInt32), int64(math.MinInt32), nil}, {int64(math.MaxInt32), int64(math.MaxInt32), nil},
			{int64(math.MaxInt32) + 1, nil, ErrValue}, {int64(math.MinInt32) - 1, nil, ErrValue},
		}},
		{"I", uint64(0), []check{
			{int64(math.MaxUint32), uint64(math.MaxUint32), nil}, {int64(math.MaxUint32) + 1, nil, ErrValue},
		}},
		{"l", int64(0), []check{
			{int64(math.MinInt64), int64(math.MinInt64), nil}, {uint64(math.MaxInt64), int64(math.MaxInt64), nil},
			{uint64(math.MaxInt64) + 1, nil, ErrValue},
		}},
		{"L", uint64(0), []check{
			{uint64(math.MaxUint64), uint64(math.MaxUint64), nil}, {int64(-1), nil, ErrValue},
		}},
		{"q", int64(0), []check{
			{int64(math.MaxInt64), int64(math.MaxInt64), nil}, {uint64(1 << 63), nil, ErrValue}, {0.5, nil, ErrType},
		}},
		{"Q", uint64(0), []check{
			{uint64(math.MaxUint64), uint64(math.MaxUint64), nil}, {int64(math.MinInt64), nil, ErrValue},
		}},
		{"f", float64(0), []check{
			{0.1, float64(float32(0.1)), nil}, {int64(3), 3.0, nil}, {uint64(16777217), float64(16777216), nil},
			{1e300, math.Inf(1), nil}, {"x", nil, ErrType}, {true, nil, ErrType},
		}},
		{"d", float64(0), []check{
			{0.1, 0.1, nil}, {int64(-3), -3.0, nil}, {math.MaxFloat64, math.MaxFloat64, nil}, {[]byte{}, nil, ErrType},
		}},
		{"?", false, []check{
			{true, true, nil}, {false, false, nil}, {int64(2), true, nil}, {int64(0), false, nil}, {uint64(1), true, nil},
			{1.0, nil, ErrType}, {"true", nil, ErrType},
		}},
		{"c", []byte{0}, []check{
			{[]byte("x"), []byte("x"), nil}, {[]byte{}, nil, ErrType}, {[]byte("xy"), nil, ErrType}, {"x", nil, ErrType},
			{int64(65), nil, ErrType},
		}},
		{"O", []byte{}, []check{
			{[]byte("pickle"), []byte("pickle"), nil}, {[]byte{}, []byte{}, nil}, {"str", nil, ErrType}, {int64(1), nil, ErrType},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			v := newTestValue(t, tt.code, nil)
			if got := v.Get(); !reflect.DeepEqual(got, tt.zero) {
				t.Fatalf("zero value %#v, want %#v", got, tt.zero)
			}
			if v.Typecode() != tt.code || v.Kind() != KindValue {
				t.Fatal("typecode or kind")
			}
			for _, c := range tt.checks {
				prev := v.Get()
				err := v.Set(c.in)
				if c.err != nil {
					if !isErr(err, c.err) {
						t.Errorf("set %#v: got %v, want %v", c.in, err, c.err)
					}
					if !reflect.DeepEqual(v.Get(), prev) {
						t.Errorf("set %#v failed but changed the value", c.in)
					}
					if c.in == nil { // a nil initial value means the zero value
						continue
					}
					if _, err := newValue("v", tt.code, c.in); !isErr(err, c.err) {
						t.Errorf("create with %#v: got %v, want %v", c.in, err, c.err)
					}
					continue
				}
				if err != nil {
					t.Errorf("set %#v: %v", c.in, err)
					continue
				}
				if got := v.Get(); !reflect.DeepEqual(got, c.want) {
					t.Errorf("set %#v: stored %#v, want %#v", c.in, got, c.want)
				}
				if nv, err := newValue("v", tt.code, c.in); err != nil || !reflect.DeepEqual(nv.Get(), c.want) {
					t.Errorf("create with %#v: %v %v", c.in, nv, err)
				}
			}
		})
	}
	if _, err := newValue("v", "x", nil); !isErr(err, ErrValue) {
		t.Fatalf("unknown typecode: %v", err)
	}
	if _, err := newValue("v", "", nil); !isErr(err, ErrValue) {
		t.Fatalf("empty typecode: %v", err)
	}
}

func TestValueAdd(t *testing.T) {
	tests := []struct {
		code    string
		initial any
		delta   any
		want    any
		err     error
	}{
		// Integers wrap around like C.
		{"b", int64(127), int64(1), int64(-128), nil},
		{"b", int64(-128), int64(-1), int64(127), nil},
		{"b", int64(0), int64(300), int64(44), nil},
		{"B", int64(255), int64(1), uint64(0), nil},
		{"B", int64(0), int64(-1), uint64(255), nil},
		{"h", int64(32767), int64(1), int64(-32768), nil},
		{"H", int64(65535), int64(2), uint64(1), nil},
		{"H", int64(0), int64(-1), uint64(65535), nil},
		{"i", int64(math.MaxInt32), int64(1), int64(math.MinInt32), nil},
		{"i", int64(math.MinInt32), int64(-1), int64(math.MaxInt32), nil},
		{"I", int64(math.MaxUint32), int64(1), uint64(0), nil},
		{"I", int64(0), int64(-1), uint64(math.MaxUint32), nil},
		{"l", int64(math.MaxInt64), int64(1), int64(math.MinInt64), nil},
		{"L", uint64(math.MaxUint64), int64(1), uint64(0), nil},
		{"q", int64(math.MaxInt64), int64(1), int64(math.MinInt64), nil},
		{"q", int64(math.MinInt64), int64(-1), int64(math.MaxInt64), nil},
		{"q", int64(5), uint64(math.MaxUint64), int64(4), nil},
		{"Q", uint64(math.MaxUint64), int64(1), uint64(0), nil},
		{"Q", int64(0), int64(-1), uint64(math.MaxUint64), nil},
		{"Q", int64(1), uint64(math.MaxUint64), uint64(0), nil},
		{"i", int64(5), int64(-7), int64(-2), nil},
		// Floats.
		{"d", d01, 0.2, d01 + 0.2, nil}, // float64 arithmetic, not exact constants
		{"d", 1.0, int64(2), 3.0, nil},
		{"d", 1.0, uint64(2), 3.0, nil},
		{"f", 0.0, 0.1, float64(float32(0.1)), nil},
		{"f", f01, 0.2, float64(float32(f01 + 0.2)), nil}, // rounded after a float64 add
		{"f", 16777216.0, int64(1), 16777216.0, nil},
		// Type errors.
		{"i", int64(1), 1.5, nil, ErrType},
		{"i", int64(1), nil, nil, ErrType},
		{"i", int64(1), "1", nil, ErrType},
		{"d", 1.0, "1", nil, ErrType},
		{"d", 1.0, true, nil, ErrType},
		{"?", true, int64(1), nil, ErrType},
		{"c", []byte("a"), int64(1), nil, ErrType},
		{"O", []byte("a"), int64(1), nil, ErrType},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %v+%v", tt.code, tt.initial, tt.delta), func(t *testing.T) {
			v := newTestValue(t, tt.code, tt.initial)
			before := v.Get()
			got, err := v.Add(tt.delta)
			if tt.err != nil {
				if !isErr(err, tt.err) {
					t.Fatalf("got %v, want %v", err, tt.err)
				}
				if !reflect.DeepEqual(v.Get(), before) {
					t.Fatal("failed add changed the value")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) || !reflect.DeepEqual(v.Get(), tt.want) {
				t.Fatalf("got %#v, stored %#v, want %#v", got, v.Get(), tt.want)
			}
		})
	}
}

func TestValueCompareAndSet(t *testing.T) {
	v := newTestValue(t, "i", int64(5))
	if ok, err := v.CompareAndSet(int64(4), int64(9)); ok || err != nil || v.Get() != int64(5) {
		t.Fatalf("mismatch: %v %v %v", ok, err, v.Get())
	}
	if ok, err := v.CompareAndSet(uint64(5), int64(9)); !ok || err != nil || v.Get() != int64(9) {
		t.Fatalf("match: %v %v %v", ok, err, v.Get())
	}
	if _, err := v.CompareAndSet(int64(9), int64(1)<<40); !isErr(err, ErrValue) || v.Get() != int64(9) {
		t.Fatalf("new out of range: %v %v", err, v.Get())
	}
	if _, err := v.CompareAndSet(1.5, int64(1)); !isErr(err, ErrType) {
		t.Fatalf("expected of wrong type: %v", err)
	}

	o := newTestValue(t, "O", []byte("a"))
	if ok, _ := o.CompareAndSet([]byte("a"), []byte("b")); !ok || !bytes.Equal(o.Get().([]byte), []byte("b")) {
		t.Fatal("bytes cas")
	}
	if ok, _ := o.CompareAndSet([]byte("a"), []byte("c")); ok {
		t.Fatal("bytes cas with a stale expected value")
	}

	f := newTestValue(t, "f", 0.1)
	if ok, _ := f.CompareAndSet(0.1, 0.5); !ok { // expected is rounded like the stored value
		t.Fatal("float32 cas with the unrounded value")
	}
	b := newTestValue(t, "?", false)
	if ok, _ := b.CompareAndSet(int64(0), true); !ok || b.Get() != true {
		t.Fatal("bool cas")
	}
	if st, w := b.Describe(); st != "?: true" || w != 0 {
		t.Fatalf("describe %q", st)
	}
	if st, _ := o.Describe(); st != "O: 1 bytes" {
		t.Fatalf("describe %q", st)
	}
}

func TestValueCreateThroughManager(t *testing.T) {
	m := newManager(t, DefaultConfig())
	s := newSession(t, m)
	v := create[*Value](t, m, s, KindValue, "counter", Params{Typecode: "q", Initial: int64(41)})
	if got, _ := v.Add(int64(1)); got != int64(42) {
		t.Fatalf("add: %v", got)
	}
	if _, _, err := m.Create(s, KindValue, "bad", Params{Typecode: "b", Initial: int64(1000)}); !isErr(err, ErrValue) {
		t.Fatalf("initial out of range: %v", err)
	}
	if _, _, err := m.Create(s, KindValue, "bad", Params{Typecode: "z"}); !isErr(err, ErrValue) {
		t.Fatalf("bad typecode: %v", err)
	}
	if _, err := m.Lookup(KindValue, "bad"); !isErr(err, ErrNoSuchObject) {
		t.Fatal("a failed create left an object behind")
	}
}
