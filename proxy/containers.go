package proxy

import (
	"context"
	"fmt"
	"reflect"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/syncmgr/syncmgr/wire"
)

// Handles of the containers family: dict and list.

// Dict is a shared dict. Keys and values are values in the encoding both
// clients share (see EncodeValue and CanonicalKey): a Go process finds the
// keys a Python process set, and Python reads what Go stored.
type Dict struct{ Handle }

// Dict returns the named dict.
func (c *Client) Dict(ctx context.Context, name string) (*Dict, error) {
	h, err := c.create(ctx, wire.KindDict, name)
	return &Dict{h}, err
}

// Get returns the value for key; an error with code key_error if absent.
func (d *Dict) Get(ctx context.Context, key any) (any, error) {
	ck, err := CanonicalKey(key)
	if err != nil {
		return nil, err
	}
	res, err := d.call(ctx, wire.OpGet, nil, wire.ArgKey, ck)
	if err != nil {
		return nil, err
	}
	b, _ := res.([]byte)
	return DecodeValue(b)
}

// entry is the wire form of one key and value: the canonical key, the key
// as a value (what items gives back) and the value.
func entry(key, value any) (ck, kp, v []byte, err error) {
	switch reflect.ValueOf(key).Kind() {
	case reflect.Slice, reflect.Array:
		if _, isBytes := key.([]byte); !isBytes {
			// Get finds a Python tuple key by a slice; but a slice stored as a
			// key would read back in Python as a list, which no dict can hold.
			err = fmt.Errorf("syncmgr: a %T cannot be stored as a dict key shared with Python", key)
			return
		}
	}
	if ck, err = CanonicalKey(key); err != nil {
		return
	}
	if kp, err = EncodeValue(key); err != nil {
		return
	}
	v, err = EncodeValue(value)
	return
}

// Set stores value under key.
func (d *Dict) Set(ctx context.Context, key, value any) error {
	ck, kp, v, err := entry(key, value)
	if err != nil {
		return err
	}
	_, err = d.call(ctx, wire.OpSet, nil, wire.ArgKey, ck, wire.ArgKeyP, kp, wire.ArgValue, v)
	return err
}

// Delete removes key.
func (d *Dict) Delete(ctx context.Context, key any) error {
	ck, err := CanonicalKey(key)
	if err != nil {
		return err
	}
	_, err = d.call(ctx, wire.OpDel, nil, wire.ArgKey, ck)
	return err
}

// Update stores several entries atomically.
func (d *Dict) Update(ctx context.Context, entries map[string]any) error {
	triples := make([][][]byte, 0, len(entries))
	for k, v := range entries {
		ck, kp, vb, err := entry(k, v)
		if err != nil {
			return err
		}
		triples = append(triples, [][]byte{ck, kp, vb})
	}
	raw, err := msgpack.Marshal(triples)
	if err != nil {
		return err
	}
	_, err = d.call(ctx, wire.OpUpdate, nil, wire.ArgItems, raw)
	return err
}

// Entry is one key and value of a Dict.
type Entry struct {
	Key, Value any
}

// Items returns a snapshot of the entries in insertion order.
func (d *Dict) Items(ctx context.Context) ([]Entry, error) {
	res, err := d.call(ctx, wire.OpItems, nil)
	if err != nil {
		return nil, err
	}
	pairs, _ := res.([]any)
	out := make([]Entry, 0, len(pairs))
	for _, p := range pairs {
		kv, _ := p.([]any)
		if len(kv) != 2 {
			return nil, fmt.Errorf("syncmgr: malformed items reply")
		}
		kb, _ := kv[0].([]byte)
		vb, _ := kv[1].([]byte)
		k, err := DecodeValue(kb)
		if err != nil {
			return nil, err
		}
		v, err := DecodeValue(vb)
		if err != nil {
			return nil, err
		}
		out = append(out, Entry{k, v})
	}
	return out, nil
}

// Len returns the number of entries.
func (d *Dict) Len(ctx context.Context) (int, error) {
	res, err := d.call(ctx, wire.OpLen, nil)
	n, _ := toInt(res)
	return n, err
}

// Namespace is a shared namespace: a Dict whose keys are attribute names.
type Namespace struct{ Dict }

// Namespace returns the named namespace.
func (c *Client) Namespace(ctx context.Context, name string) (*Namespace, error) {
	h, err := c.create(ctx, wire.KindNamespace, name)
	return &Namespace{Dict{h}}, err
}

// Attr returns attribute name; an error with code key_error if unset.
func (n *Namespace) Attr(ctx context.Context, name string) (any, error) { return n.Get(ctx, name) }

// SetAttr sets attribute name.
func (n *Namespace) SetAttr(ctx context.Context, name string, v any) error {
	return n.Set(ctx, name, v)
}

// List is a shared list of values (see EncodeValue).
type List struct{ Handle }

// List returns the named list.
func (c *Client) List(ctx context.Context, name string) (*List, error) {
	h, err := c.create(ctx, wire.KindList, name)
	return &List{h}, err
}

// Append adds an item at the end.
func (l *List) Append(ctx context.Context, v any) error {
	b, err := EncodeValue(v)
	if err != nil {
		return err
	}
	_, err = l.call(ctx, wire.OpAppend, nil, wire.ArgValue, b)
	return err
}

// Get returns item i (negative counts from the end).
func (l *List) Get(ctx context.Context, i int) (any, error) {
	res, err := l.call(ctx, wire.OpGetItem, nil, wire.ArgIndex, i)
	if err != nil {
		return nil, err
	}
	b, _ := res.([]byte)
	return DecodeValue(b)
}

// Len returns the number of items.
func (l *List) Len(ctx context.Context) (int, error) {
	res, err := l.call(ctx, wire.OpLen, nil)
	n, _ := toInt(res)
	return n, err
}
