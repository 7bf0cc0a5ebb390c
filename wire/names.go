package wire

// Op, kind and argument names of protocol version 1 (docs/protocol.md
// sections 5 to 7). The daemon's op table and the Go client use these; the
// strings are the protocol and never change meaning.

// Kinds of shared objects.
const (
	KindLock             = "lock"
	KindRLock            = "rlock"
	KindSemaphore        = "semaphore"
	KindBoundedSemaphore = "bounded_semaphore"
	KindEvent            = "event"
	KindValue            = "value"
	KindQueue            = "queue"
	KindJoinableQueue    = "joinable_queue"
	KindCondition        = "condition"
	KindBarrier          = "barrier"
	KindDict             = "dict"
	KindList             = "list"
	KindNamespace        = "namespace"
)

// Ops that address no object (family admin) and the shared-memory registry
// (family shm).
const (
	OpPing      = "ping"
	OpCreate    = "create"
	OpDelete    = "delete"
	OpIncref    = "incref"
	OpDecref    = "decref"
	OpShare     = "share"
	OpCancel    = "cancel"
	OpStatus    = "status"
	OpShmCreate = "shm_create"
	OpShmAttach = "shm_attach"
	OpShmDetach = "shm_detach"
	OpShmUnlink = "shm_unlink"
	OpShmList   = "shm_list"
	// The same-host fast path (family fastpath).
	OpFastpathAttach = "fastpath_attach"
	OpFastpathRef    = "fastpath_ref"
	// OpQueueAttach: a Queue's ring, its descriptor passed with SCM_RIGHTS.
	OpQueueAttach = "queue_attach"
)

// Ops of objects (each request also carries ArgKind and ArgName).
const (
	// Lock, RLock, Semaphore, BoundedSemaphore, Condition.
	OpAcquire = "acquire"
	OpRelease = "release"
	// Condition.
	OpNotify    = "notify"
	OpNotifyAll = "notify_all"
	// Condition, Event, Barrier.
	OpWait = "wait"
	// Event.
	OpIsSet = "is_set"
	OpSet   = "set" // also Value, dict
	OpClear = "clear"
	// Value.
	OpGet = "get" // also Queue, dict
	OpAdd = "add"
	OpCAS = "cas"
	// Queue, JoinableQueue.
	OpPut = "put"
	// OpPutMany: the items (ArgItems) all together, adjacent and in order,
	// or none; OpGetMany: at least one item, at most ArgN, in one reply.
	OpPutMany = "put_many"
	OpGetMany = "get_many"
	OpUnget   = "unget"
	OpQsize   = "qsize"
	OpEmpty   = "empty"
	OpFull    = "full"
	// JoinableQueue.
	OpTaskDone   = "task_done"
	OpUnfinished = "unfinished"
	OpJoin       = "join"
	// Barrier.
	OpActionDone = "action_done"
	OpAbort      = "abort"
	OpReset      = "reset"
	OpParties    = "parties"
	OpNWaiting   = "n_waiting"
	OpBroken     = "broken"
	// dict, Namespace.
	OpSetDefault = "setdefault"
	OpDel        = "del"
	OpPop        = "pop" // also list
	OpPopItem    = "popitem"
	OpContains   = "contains"
	OpLen        = "len" // also list
	OpUpdate     = "update"
	OpItems      = "items"
	// list.
	OpGetItem  = "getitem"
	OpSetItem  = "setitem"
	OpDelItem  = "delitem"
	OpAppend   = "append"
	OpExtend   = "extend"
	OpInsert   = "insert"
	OpRemove   = "remove"
	OpIndex    = "index"
	OpCount    = "count"
	OpSnapshot = "snapshot"
	OpReplace  = "replace"
)

// Argument names.
const (
	ArgKind     = "kind"
	ArgName     = "name"
	ArgID       = "id"      // cancel: the request to cancel
	ArgTID      = "tid"     // the calling thread (lock ownership)
	ArgBlock    = "block"   // false: do not wait
	ArgTimeout  = "timeout" // seconds; nil waits for ever
	ArgSince    = "since"   // Event wait: a generation; any set after it counts (fast-path waiters)
	ArgValue    = "value"
	ArgTypecode = "typecode"
	ArgDelta    = "delta"
	ArgExpected = "expected"
	ArgNew      = "new"
	ArgMaxSize  = "maxsize"
	ArgLock     = "lock"
	ArgParties  = "parties"
	ArgAction   = "action"
	ArgOK       = "ok"
	ArgN        = "n"
	ArgItem     = "item"
	ArgItems    = "items"
	ArgKey      = "key"
	ArgKeyP     = "kp" // the pickled key, returned by items and popitem
	ArgIndex    = "index"
	ArgVersion  = "version"
	ArgLimit    = "limit"
	ArgSize     = "size"
	ArgTasks    = "tasks" // queue_attach: the client keeps a JoinableQueue's task counts in its ring
	// ArgRun, on any request, is the daemon run id under which the client
	// got the state the request acts on (a lock it acquired); a daemon of
	// another run answers server_restarted and does nothing.
	ArgRun = "run"
	// ArgFastpath, on create: the client maps the daemon's segment, so the
	// reply may carry the object's word (its fastpath_ref answer, as "fp").
	ArgFastpath = "fastpath"
)

// wireNames are every name above: DecodeRequest hands these strings out
// for a request's op and for string values that are wire names (its kind)
// instead of copies of the frame's bytes (a test checks that the list has
// them all); keys it compares in place.
var wireNames = [...]string{
	KindLock, KindRLock, KindSemaphore, KindBoundedSemaphore, KindEvent, KindValue, KindQueue,
	KindJoinableQueue, KindCondition, KindBarrier, KindDict, KindList, KindNamespace, OpPing, OpCreate,
	OpDelete, OpIncref, OpDecref, OpShare, OpCancel, OpStatus, OpShmCreate, OpShmAttach, OpShmDetach,
	OpShmUnlink, OpShmList, OpFastpathAttach, OpFastpathRef, OpQueueAttach, OpAcquire, OpRelease, OpNotify,
	OpNotifyAll, OpWait, OpIsSet, OpSet, OpClear, OpGet, OpAdd, OpCAS, OpPut, OpPutMany, OpGetMany, OpUnget,
	OpQsize, OpEmpty, OpFull, OpTaskDone, OpUnfinished, OpJoin, OpActionDone, OpAbort, OpReset, OpParties,
	OpNWaiting, OpBroken, OpSetDefault, OpDel, OpPop, OpPopItem, OpContains, OpLen, OpUpdate, OpItems,
	OpGetItem, OpSetItem, OpDelItem, OpAppend, OpExtend, OpInsert, OpRemove, OpIndex, OpCount, OpSnapshot,
	OpReplace, ArgKind, ArgName, ArgID, ArgTID, ArgBlock, ArgTimeout, ArgSince, ArgValue, ArgTypecode, ArgDelta,
	ArgExpected, ArgNew, ArgMaxSize, ArgLock, ArgParties, ArgAction, ArgOK, ArgN, ArgItem, ArgItems, ArgKey,
	ArgKeyP, ArgIndex, ArgVersion, ArgLimit, ArgSize, ArgTasks, ArgRun, ArgFastpath,
}
