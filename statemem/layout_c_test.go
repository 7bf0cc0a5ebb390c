package statemem

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The C extension of the Python client (pyclient/csrc) keeps its own copy
// of the layout, as #defines, and at run time only the magic, the version
// and the header size are compared. This test reads the C sources and
// checks every constant there against the Go side's: each is either in
// cLayout (its Go value) or in cOnly (why it has none), so that a constant
// changed, added or dropped on one side alone fails here.

// cLayout is every C constant that the Go side has too, by its C name.
var cLayout = map[string]uint64{
	// fastpath.h: the state segment's header and object slots.
	"MAGIC":           Magic,
	"VERSION":         uint64(Version),
	"SLOT_SIZE":       SlotSize,
	"OFF_AUX":         OffAux,
	"OFF_TAG":         OffTag,
	"OFF_SINCE":       OffSince,
	"OFF_LEDGER":      OffLedger,
	"OFF_LEDGER_LEN":  OffLedgerLen,
	"OFF_HEIR":        OffHeir,
	"MAX_SEGMENT":     maxCapacity * SlotSize,
	"HDR_WAITERS":     HdrWaiters,
	"HDR_WAITERS_LEN": HdrWaitersLen,
	"HDR_UNRECORDED":  HdrUnrecorded,
	"ENTRY_SIZE":      EntrySize,

	// fastpath.h: state word bits.
	"MASK_LOW":      MaskLow,
	"BIT_WAITERS":   BitWaiters,
	"BIT_DAEMON":    BitDaemon,
	"DEPTH_SHIFT":   DepthShift,
	"DEPTH_ONE":     DepthOne,
	"EVENT_FLAG":    EventFlag,
	"EVENT_GEN_ONE": EventGenOne,
	"EVENT_GEN_MAX": EventGenMax,
	"LATCH_SHIFT":   LatchShift,
	"MASK_LATCH":    MaskLatch,
	"LATCH_SPIN":    latchSpin,
	"WAKE_NORMAL":   wakeNormal,
	"WAKE_HEIR":     wakeHeir,

	// fastpath.h: op results (an enum).
	"RES_OK":        uint64(OK),
	"RES_BUSY":      uint64(Busy),
	"RES_DAEMON":    uint64(Daemon),
	"RES_NOT_OWNER": uint64(NotOwner),

	// fp_ring.h: a Queue's ring.
	"RING_MAGIC":     RingMagic,
	"RING_VERSION":   uint64(RingVersion),
	"RING_SLOTS":     RingSlots,
	"RING_HEADER":    RingHeader,
	"RING_HOT":       RingHot,
	"RING_MAX_CAP":   RingMaxCapacity,
	"R_CAP":          ringOffCap,
	"R_INLINE":       ringOffInline,
	"R_JPROOF":       ringOffJProof,
	"R_JOP":          ringOffJOp,
	"R_JHOLDER":      ringOffJHolder,
	"R_LATCH":        ringOffLatch,
	"R_FLAGS":        ringOffFlags,
	"R_TAIL":         ringOffTail,
	"R_HEAD":         ringOffHead,
	"R_SEQ":          ringOffSeq,
	"R_WAITERS":      ringOffWaiters,
	"R_DONE":         ringOffDone,
	"R_SLOTS":        ringOffSlots,
	"R_OWED":         ringOffOwed,
	"WAIT_GET":       uint64(RingWaitGet),
	"WAIT_PUT":       uint64(RingWaitPut),
	"WAIT_JOIN":      uint64(RingWaitJoin),
	"FLAG_DAEMON":    RingFlagDaemon,
	"FLAG_OVER":      RingFlagOver,
	"REC_ITEM":       uint64(RecItem),
	"REC_EXTERNAL":   uint64(RecExternal),
	"REC_PAD":        uint64(RecPad),
	"REC_HEADER":     recHeader,
	"POS_BITS":       ringPosBits,
	"POS_MASK":       ringPosMask,
	"COUNT_MASK":     ringCountMax,
	"JOURNAL_GET":    RingJournalGet,
	"JOURNAL_DONE":   RingJournalDone,
	"MAX_UNFINISHED": RingMaxUnfinished,
	"RES_NONE":       uint64(Busy), // a ring op that found the queue full or empty
}

// cSeconds is every C constant in seconds that the Go side has as a
// duration.
var cSeconds = map[string]float64{
	"STARVE_AFTER":    StarveAfter.Seconds(),
	"RESERVED_NAP":    ReservedNap.Seconds(),
	"LATCH_GRACE":     LatchGrace.Seconds(),
	"LATCH_GRACE_NOW": LatchGraceNow.Seconds(),
}

// cOnly is every C constant the Go side has no counterpart of, and why.
var cOnly = map[string]string{
	"SPIN_READS":       "the C extension's reads of a word before its first sleep; the Go client does not spin",
	"BIG_COPY":         "copies of this many bytes let go of the GIL",
	"MAX_PARTS":        "buffers put_parts takes at once (a Python API)",
	"SLEEP_SLICE":      "the C extension's longest sleep on a ring's seq; the Go client's slice is proxy's fastWait",
	"TAG":              "the value encoding's tag byte (proxy.ValueTag), not shared-memory layout",
	"HANDLE_LOCK":      "LockHandle's kind argument, between the C extension and its Python caller",
	"HANDLE_RLOCK":     "LockHandle's kind argument, between the C extension and its Python caller",
	"HANDLE_SEMAPHORE": "LockHandle's kind argument, between the C extension and its Python caller",
	"CACHE_SLOTS":      "mappings the extension keeps per process for large items' memory (fp_itembuf.c), not shared",
	"CACHE_BYTES":      "bytes the extension keeps per process for large items' memory (fp_itembuf.c), not shared",
}

// cSources is where the C extension is, from this package's directory.
const cSources = "../pyclient/csrc"

func TestLayoutMatchesC(t *testing.T) {
	defs, err := readCDefines(cSources)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range cLayout {
		expr, ok := defs[name]
		if !ok {
			t.Errorf("%s: not defined in %s (drop it from cLayout if the C side no longer has it)", name, cSources)
			continue
		}
		got, err := evalC(expr, defs)
		if err != nil {
			t.Errorf("%s = %s: %v", name, expr, err)
		} else if got != want {
			t.Errorf("%s = %s = %#x in C, %#x in Go", name, expr, got, want)
		}
	}
	for name, want := range cSeconds {
		expr, ok := defs[name]
		if !ok {
			t.Errorf("%s: not defined in %s (drop it from cSeconds if the C side no longer has it)", name, cSources)
			continue
		}
		got, err := strconv.ParseFloat(expr, 64)
		if err != nil {
			t.Errorf("%s = %s: not a number of seconds", name, expr)
		} else if got != want {
			t.Errorf("%s = %s s in C, %v s in Go", name, expr, want)
		}
	}
	for name := range cOnly {
		if _, ok := defs[name]; !ok {
			t.Errorf("%s: in cOnly but not defined in %s", name, cSources)
		}
	}
	var unknown []string
	for name := range defs {
		_, a := cLayout[name]
		_, b := cSeconds[name]
		_, c := cOnly[name]
		if !a && !b && !c {
			unknown = append(unknown, name)
		}
	}
	sort.Strings(unknown)
	for _, name := range unknown {
		t.Errorf("%s = %s: a C constant the test does not know; add it to cLayout with its Go value (or to cOnly, saying why Go has none)", name, defs[name])
	}
}

// TestEvalC checks the evaluator on the forms the C sources use, with C's
// widths: an unsuffixed or u-suffixed constant is 32 bits wide.
func TestEvalC(t *testing.T) {
	defs := map[string]string{"N": "1024u", "SH": "40", "ONE": "1ULL", "SZ": "64u"}
	for expr, want := range map[string]uint64{
		"0x5152474d434e5953ULL":       0x5152474d434e5953,
		"(128u + 16u * N)":            128 + 16*1024,
		"((1ULL << SH) - 1)":          1<<40 - 1,
		"(256u << 10)":                256 << 10,
		"((uint64_t)SZ << 24)":        64 << 24,
		"(SZ << 28)":                  0, // 32 bits wide: shifted out
		"(~1u)":                       0xfffffffe,
		"(((1ULL << 29) - 1) & ~ONE)": 1<<29 - 2,
		"(1ULL << 29) | 7 - 2 * 3":    1<<29 | 1,
		"100":                         100,
	} {
		got, err := evalC(expr, defs)
		if err != nil || got != want {
			t.Errorf("evalC(%q) = %#x, %v; want %#x", expr, got, err, want)
		}
	}
	for _, expr := range []string{"", "(1", "1 +", "NOPE", "1.5", "1 / 0", "\"s\""} {
		if got, err := evalC(expr, defs); err == nil {
			t.Errorf("evalC(%q) = %#x, want an error", expr, got)
		}
	}
}

var (
	cComment = regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)
	cDefine  = regexp.MustCompile(`^#\s*define\s+([A-Za-z_]\w*)(\(?)(.*)$`)
	cEnum    = regexp.MustCompile(`\benum\s*\{([^}]*)\}`)
)

// readCDefines returns the object-like #defines with a value and the enum
// members of every .c and .h file in dir, by name, as their expression
// text. Function-like macros and defines without a value are left out.
func readCDefines(dir string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.[ch]"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no C sources in %s", dir)
	}
	defs := make(map[string]string)
	where := make(map[string]string)
	add := func(file, name, expr string) error {
		if old, ok := defs[name]; ok && old != expr {
			return fmt.Errorf("%s is %q in %s and %q in %s", name, old, where[name], expr, file)
		}
		defs[name], where[name] = expr, file
		return nil
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		src := strings.ReplaceAll(string(b), "\\\n", " ")
		src = cComment.ReplaceAllStringFunc(src, func(c string) string {
			return strings.Repeat("\n", strings.Count(c, "\n")) // keep #define lines apart
		})
		for _, line := range strings.Split(src, "\n") {
			m := cDefine.FindStringSubmatch(strings.TrimSpace(line))
			if m == nil || m[2] == "(" {
				continue // not a define, or a function-like macro
			}
			if expr := strings.TrimSpace(m[3]); expr != "" {
				if err := add(file, m[1], expr); err != nil {
					return nil, err
				}
			}
		}
		for _, m := range cEnum.FindAllStringSubmatch(src, -1) {
			next := "0"
			for _, item := range strings.Split(m[1], ",") {
				name, expr, ok := strings.Cut(strings.TrimSpace(item), "=")
				name = strings.TrimSpace(name)
				if name == "" {
					continue
				}
				if ok {
					next = strings.TrimSpace(expr)
				}
				if err := add(file, name, next); err != nil {
					return nil, err
				}
				next = "(" + next + ") + 1"
			}
		}
	}
	return defs, nil
}

// cValue is a C integer constant's value and whether it is 64 bits wide
// (an ll-suffixed or uint64_t operand); otherwise C computes it in 32 bits.
type cValue struct {
	v    uint64
	wide bool
}

func (x cValue) fit() cValue {
	if !x.wide {
		x.v &= 1<<32 - 1
	}
	return x
}

// evalC evaluates the integer constant expression expr, whose names are
// other entries of defs: literals (decimal, hexadecimal, u/l suffixes),
// unary ~ - +, * / % + - << >> & ^ |, parentheses and casts to uint64_t or
// uint32_t.
func evalC(expr string, defs map[string]string) (uint64, error) {
	p := &cParser{defs: defs, seen: map[string]bool{}}
	x, err := p.eval(expr)
	return x.v, err
}

type cParser struct {
	defs map[string]string
	seen map[string]bool // names being expanded: a loop is an error
}

var cToken = regexp.MustCompile(`^\s*(0[xX][0-9a-fA-F]+[uUlL]*|[0-9]+[uUlL]*|[A-Za-z_]\w*|<<|>>|[-+*/%&|^~()])`)

func (p *cParser) eval(expr string) (cValue, error) {
	var toks []string
	for rest := expr; strings.TrimSpace(rest) != ""; {
		m := cToken.FindStringSubmatch(rest)
		if m == nil {
			return cValue{}, fmt.Errorf("cannot read %q", strings.TrimSpace(rest))
		}
		toks = append(toks, m[1])
		rest = rest[len(m[0]):]
	}
	s := &cScan{p: p, toks: toks}
	x, err := s.binary(0)
	if err == nil && s.i < len(toks) {
		err = fmt.Errorf("unexpected %q", toks[s.i])
	}
	return x, err
}

type cScan struct {
	p    *cParser
	toks []string
	i    int
}

func (s *cScan) peek() string {
	if s.i < len(s.toks) {
		return s.toks[s.i]
	}
	return ""
}

// cLevels are C's binary operators from the loosest binding to the
// tightest.
var cLevels = [][]string{{"|"}, {"^"}, {"&"}, {"<<", ">>"}, {"+", "-"}, {"*", "/", "%"}}

func (s *cScan) binary(level int) (cValue, error) {
	if level == len(cLevels) {
		return s.unary()
	}
	x, err := s.binary(level + 1)
	for err == nil {
		op := s.peek()
		found := false
		for _, o := range cLevels[level] {
			found = found || o == op
		}
		if !found {
			break
		}
		s.i++
		var y cValue
		if y, err = s.binary(level + 1); err != nil {
			break
		}
		wide := x.wide || y.wide
		switch op {
		case "|":
			x.v |= y.v
		case "^":
			x.v ^= y.v
		case "&":
			x.v &= y.v
		case "<<":
			x.v <<= y.v
			wide = x.wide // a shift has its left operand's type
		case ">>":
			x.v >>= y.v
			wide = x.wide
		case "+":
			x.v += y.v
		case "-":
			x.v -= y.v
		case "*":
			x.v *= y.v
		case "/", "%":
			if y.v == 0 {
				return cValue{}, fmt.Errorf("division by zero")
			}
			if op == "/" {
				x.v /= y.v
			} else {
				x.v %= y.v
			}
		}
		x.wide = wide
		x = x.fit()
	}
	return x, err
}

func (s *cScan) unary() (cValue, error) {
	switch tok := s.peek(); tok {
	case "~", "-", "+":
		s.i++
		x, err := s.unary()
		switch tok {
		case "~":
			x.v = ^x.v
		case "-":
			x.v = -x.v
		}
		return x.fit(), err
	case "(":
		if s.i+2 < len(s.toks) && s.toks[s.i+2] == ")" && (s.toks[s.i+1] == "uint64_t" || s.toks[s.i+1] == "uint32_t") {
			wide := s.toks[s.i+1] == "uint64_t"
			s.i += 3
			x, err := s.unary()
			x.wide = wide
			return x.fit(), err
		}
		s.i++
		x, err := s.binary(0)
		if err == nil && s.peek() != ")" {
			err = fmt.Errorf("missing )")
		}
		s.i++
		return x, err
	case "":
		return cValue{}, fmt.Errorf("expression ends early")
	default:
		s.i++
		if tok[0] >= '0' && tok[0] <= '9' {
			digits := strings.TrimRight(tok, "uUlL")
			v, err := strconv.ParseUint(digits, 0, 64)
			if err != nil {
				return cValue{}, err
			}
			suffix := strings.ToLower(tok[len(digits):])
			return cValue{v: v, wide: strings.Contains(suffix, "l") || v > 1<<32-1}, nil
		}
		expr, ok := s.p.defs[tok]
		if !ok || s.p.seen[tok] {
			return cValue{}, fmt.Errorf("%s is not a constant", tok)
		}
		s.p.seen[tok] = true
		defer delete(s.p.seen, tok)
		x, err := s.p.eval(expr)
		if err != nil {
			err = fmt.Errorf("%s: %w", tok, err)
		}
		return x, err
	}
}
