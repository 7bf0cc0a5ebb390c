package proxy

import (
	"context"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/syncmgr/syncmgr/wire"
)

// Handles of the containers family: dict and list.

// Dict is a shared map from byte-string keys to byte-string values. (The
// Python client layers pickled keys and values on the same object.)
type Dict struct{ Handle }

// Dict returns the named dict.
func (c *Client) Dict(ctx context.Context, name string) (*Dict, error) {
	h, err := c.create(ctx, wire.KindDict, name)
	return &Dict{h}, err
}

// Get returns the value for key; an error with code key_error if absent.
func (d *Dict) Get(ctx context.Context, key []byte) ([]byte, error) {
	res, err := d.call(ctx, wire.OpGet, nil, wire.ArgKey, key)
	b, _ := res.([]byte)
	return b, err
}

// Set stores value under key.
func (d *Dict) Set(ctx context.Context, key, value []byte) error {
	_, err := d.call(ctx, wire.OpSet, nil, wire.ArgKey, key, wire.ArgKeyP, key, wire.ArgValue, value)
	return err
}

// Delete removes key.
func (d *Dict) Delete(ctx context.Context, key []byte) error {
	_, err := d.call(ctx, wire.OpDel, nil, wire.ArgKey, key)
	return err
}

// Update stores several entries atomically.
func (d *Dict) Update(ctx context.Context, entries map[string][]byte) error {
	triples := make([][][]byte, 0, len(entries))
	for k, v := range entries {
		triples = append(triples, [][]byte{[]byte(k), []byte(k), v})
	}
	raw, err := msgpack.Marshal(triples)
	if err != nil {
		return err
	}
	_, err = d.call(ctx, wire.OpUpdate, nil, wire.ArgItems, raw)
	return err
}

// Len returns the number of entries.
func (d *Dict) Len(ctx context.Context) (int, error) {
	res, err := d.call(ctx, wire.OpLen, nil)
	n, _ := toInt(res)
	return n, err
}

// List is a shared list of byte strings.
type List struct{ Handle }

// List returns the named list.
func (c *Client) List(ctx context.Context, name string) (*List, error) {
	h, err := c.create(ctx, wire.KindList, name)
	return &List{h}, err
}

// Append adds an item at the end.
func (l *List) Append(ctx context.Context, v []byte) error {
	_, err := l.call(ctx, wire.OpAppend, nil, wire.ArgValue, v)
	return err
}

// Get returns item i (negative counts from the end).
func (l *List) Get(ctx context.Context, i int) ([]byte, error) {
	res, err := l.call(ctx, wire.OpGetItem, nil, wire.ArgIndex, i)
	b, _ := res.([]byte)
	return b, err
}

// Len returns the number of items.
func (l *List) Len(ctx context.Context) (int, error) {
	res, err := l.call(ctx, wire.OpLen, nil)
	n, _ := toInt(res)
	return n, err
}
