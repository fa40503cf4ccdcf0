/*
 * nwc_proto.h - the nwcd wire protocol (docs/protocol.md): frame header, opcodes, and the
 * encoders/decoders of every payload, and the default socket path, shared by nwcd (daemon/) and
 * libnwc-client (client/).  proto/ includes nothing of nwc but the error header.
 *
 * Design: a frame is a fixed 24-byte little-endian header followed by `length` payload bytes.
 * Payloads are sequences of little-endian integers, IEEE floats and length-prefixed strings (u16
 * length, no NUL).  Writing goes through nwc_pw (a growable buffer); reading through nwc_pr (a
 * bounded cursor that fails with -EBADMSG on the first overrun and remembers it), and every
 * decoder ends with nwc_pr_end(), which demands that the payload was consumed exactly.  Requests
 * decode into one flat struct (nwc_proto_req) whatever the opcode, so the daemon's dispatch and
 * the fuzz target see one shape.  Nothing here allocates except nwc_pw and the import file list
 * (nwc_proto_req_clear frees it).  Not installed; include from C only.
 */
#ifndef NWC_PROTO_H
#define NWC_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define NWC_PROTO_MAGIC 0x3143574eu /* "NWC1" little-endian */
#define NWC_PROTO_VERSION 1
#define NWC_PROTO_HEADER 24
#define NWC_PROTO_MAX_PAYLOAD (16u << 20) /* larger data goes through the shared region */
#define NWC_PROTO_MAX_MSG 1024            /* error message bytes */
#define NWC_PROTO_MAX_FILES 256           /* files of one import */
#define NWC_PROTO_MAX_COLS 64             /* columns of one matvec request */
#define NWC_PROTO_NAME_MAX 1024           /* tensor name bytes */
#define NWC_PROTO_MAX_SKIPPED 1024        /* skipped tensors listed in an import2 reply */

/* Header flags. */
#define NWC_PF_EVENT 1u /* a progress event, not the final reply (replies only) */
#define NWC_PF_FDS 2u   /* file descriptors travel with this frame (SCM_RIGHTS, requests only) */
#define NWC_PF_ALONE 4u /* no other connection sent the daemon a request lately (final replies
                         * to clients with NWC_CAP_ALONE): the client may poll for its next reply */
#define NWC_PF_KNOWN 7u

/* Capabilities (hello). */
#define NWC_CAP_SHM 1u      /* shared-memory region for bulk data */
#define NWC_CAP_FDIMPORT 2u /* import from passed descriptors */
#define NWC_CAP_BATCH 4u    /* matvec of several columns */
#define NWC_CAP_MAPPED 8u   /* compute on non-resident (mmap'ed) data */
#define NWC_CAP_SHARE 16u   /* map: resident tensors shared read-only (sealed memfd) */
#define NWC_CAP_CUDA_IPC 32u /* matvec_ipc / dequant_ipc on the client's CUDA memory */
#define NWC_CAP_ALONE 64u    /* final replies carry NWC_PF_ALONE when it holds */
#define NWC_CAP_SHM_DEVICE 128u /* matvecs on GPU tensors move x and y straight between the
                                 * shared region and the GPU: clients pass small ones there too */
#define NWC_CAP_IMPORT2 256u    /* import2: skips the tensors nwc does not store and names them
                                 * (or, strict, fails on the first) */
#define NWC_CAP_DEVICES 512u    /* devices: budget and use of each place (host, each GPU) */
#define NWC_CAP_MAP_GPU 1024u   /* map_gpu: device copies shared with clients (docs/gpu-maps.md) */
#define NWC_CAP_REGISTRY 2048u  /* pull and push: models through an OCI registry (docs/oci.md) */
#define NWC_CAP_LOAD_PLACES 4096u /* load_places: one read of each blob into several places */

enum nwc_op {
  NWC_OP_HELLO = 1,
  NWC_OP_SHM = 2,
  NWC_OP_MODELS = 3,
  NWC_OP_TENSORS = 4,
  NWC_OP_INFO = 5,
  NWC_OP_IMPORT = 6,
  NWC_OP_REMOVE = 7,
  NWC_OP_LOAD = 8,
  NWC_OP_EVICT = 9,
  NWC_OP_PIN = 10,
  NWC_OP_UNPIN = 11,
  NWC_OP_DEQUANT = 12,
  NWC_OP_GATHER = 13,
  NWC_OP_MATVEC = 14,
  NWC_OP_VERIFY = 15,
  NWC_OP_STATS = 16,
  NWC_OP_PS = 17,
  NWC_OP_MAP = 18,
  NWC_OP_MATVEC_IPC = 19,
  NWC_OP_DEQUANT_IPC = 20,
  NWC_OP_LOAD_ON = 21,
  NWC_OP_IMPORT2 = 22,
  NWC_OP_DEVICES = 23,
  NWC_OP_MAP_GPU = 24,
  NWC_OP_PULL = 25,
  NWC_OP_PUSH = 26,
  NWC_OP_EVICT_ON = 27,
  NWC_OP_LOAD_PLACES = 28,
  NWC_OP_COUNT
};
/* Name of an opcode ("matvec"), or NULL for an unknown one. */
const char *nwc_proto_op_name(unsigned op);

/* The default socket path into buf[n]: $NWC_SOCKET, else /run/nwc/nwcd.sock as root, else
 * $XDG_RUNTIME_DIR/nwc/nwcd.sock, else /tmp/nwc-UID/nwcd.sock.  Returns buf. */
const char *nwc_proto_default_socket(char *buf, size_t n);

/* Output element type and placement of bulk data. */
enum { NWC_OUT_F32 = 0, NWC_OUT_BF16 = 1 };
enum { NWC_WHERE_INLINE = 0, NWC_WHERE_SHM = 1, NWC_WHERE_DEVICE = 2 /* replies of _ipc ops */ };
#define NWC_PROTO_SECRET_MAX 8192 /* pull, push: a password or token (registry tokens run to a few KB) */
#define NWC_PROTO_IPC_HANDLE 64 /* bytes of a cudaIpcMemHandle_t / cudaIpcEventHandle_t */
#define NWC_DEVICE_CPU (-1) /* host memory; 0.. are CUDA devices */
/* load_places: the bit of a place in its mask (NWC_DEVICE_CPU: bit 0, cuda:n: bit 1 + n). */
#define NWC_PLACE_BIT(device) (UINT64_C(1) << ((device) + 1))
/* The flags byte of load_on (NWC_LOAD_PIN alone) and load_places (both): other bits are refused. */
#define NWC_LOAD_PIN 1u   /* pin what it loads (at each place) */
#define NWC_LOAD_SPLIT 2u /* load_places: each tensor at one of the places (protocol.md, Split) */
/* Reply flags of compute replies. */
#define NWC_RF_MAPPED 1u  /* computed on a transient copy read from the container, not resident */
#define NWC_RF_BATCHED 2u /* shared a decoder pass with other requests */
#define NWC_RF_SHARED 4u  /* x and y moved straight between the shared region and the GPU */

typedef struct nwc_proto_hdr {
  uint32_t magic;
  uint32_t length; /* payload bytes after the header */
  uint16_t op;
  uint16_t flags;
  int32_t status; /* replies: 0 or a negative errno; requests: 0 */
  uint64_t id;    /* chosen by the client, echoed by the daemon */
} nwc_proto_hdr;

void nwc_proto_hdr_encode(const nwc_proto_hdr *h, uint8_t out[NWC_PROTO_HEADER]);
/* Decodes and checks a header (magic, flags, length <= NWC_PROTO_MAX_PAYLOAD).  Returns 0 or
 * -EBADMSG / -EMSGSIZE (nwc_error_detail says why). */
int nwc_proto_hdr_decode(const uint8_t in[NWC_PROTO_HEADER], nwc_proto_hdr *h);

/* ---- payload writer and reader ------------------------------------------------------------ */

typedef struct nwc_pw {
  uint8_t *buf; /* malloc'ed; the first NWC_PROTO_HEADER bytes are room for the header */
  size_t len, cap;
  int err; /* -ENOMEM once an allocation failed (everything after is dropped) */
} nwc_pw;

/* Starts a frame: reserves the header.  nwc_pw_finish() writes the header with the final length
 * and returns the whole frame size (or a negative errno); the caller owns w->buf (free()). */
void nwc_pw_init(nwc_pw *w);
int64_t nwc_pw_finish(nwc_pw *w, uint16_t op, uint16_t flags, int32_t status, uint64_t id);
void nwc_pw_free(nwc_pw *w);
/* The fields the daemon and the client write themselves (proto.c has the other widths). */
void nwc_pw_u32(nwc_pw *w, uint32_t v);
void nwc_pw_str(nwc_pw *w, const char *s); /* u16 length + bytes (truncated to 65535) */
void nwc_pw_bytes(nwc_pw *w, const void *p, size_t n);
/* Reserves n bytes and returns where they go (NULL after an allocation failure). */
void *nwc_pw_reserve(nwc_pw *w, size_t n);

typedef struct nwc_pr {
  const uint8_t *p;
  size_t left;
  int err; /* -EBADMSG after the first overrun */
} nwc_pr;

static inline void nwc_pr_init(nwc_pr *r, const void *p, size_t n) {
  r->p = (const uint8_t *)p, r->left = n, r->err = 0;
}
uint32_t nwc_pr_u32(nwc_pr *r); /* proto.c has the other widths */
/* Copies a string into out[cap] NUL-terminated; -EBADMSG if it does not fit, holds a NUL byte,
 * or overruns the payload. */
int nwc_pr_str(nwc_pr *r, char *out, size_t cap);
/* A pointer to the next n bytes (not aligned), or NULL on overrun. */
const void *nwc_pr_bytes(nwc_pr *r, size_t n);
/* 0 if no error and nothing is left, else -EBADMSG ("N trailing bytes" / "truncated"). */
int nwc_pr_end(nwc_pr *r, const char *what);

/* ---- requests ----------------------------------------------------------------------------- */

typedef struct nwc_proto_req {
  uint16_t op, flags;
  uint64_t id;
  /* hello */
  uint32_t ver_min, ver_max;
  uint64_t caps;
  char client[64];
  /* shm */
  uint64_t shm_size;
  /* names: models, tensors, info, import, remove, load, evict, pin, unpin, compute, verify */
  char model[NWC_PROTO_NAME_MAX];
  char tensor[NWC_PROTO_NAME_MAX];
  char bias[NWC_PROTO_NAME_MAX]; /* matvec: bias tensor of the same model, "" for none */
  /* import, import2 */
  uint8_t elem, layout, has_index;
  uint8_t import_flags; /* import2: NWC_IMPORT_* */
  uint32_t nfiles;
  char **files; /* nfiles labels, malloc'ed (nwc_proto_req_clear) */
  /* dequant, gather, matvec */
  uint8_t out, where;
  uint64_t in_off, out_off; /* shm offsets (where == SHM) */
  uint64_t out_cap;         /* shm bytes available at out_off */
  uint32_t nrows;           /* gather */
  const uint8_t *rows;      /* gather: nrows u64 little-endian, inside the payload */
  float scale;              /* matvec */
  uint32_t ncols;           /* matvec */
  const uint8_t *x;         /* matvec inline: ncols * K f32 little-endian, inside the payload */
  uint64_t x_bytes;
  /* load_on: load (load_flags 0) or pin (NWC_LOAD_PIN) onto device (NWC_DEVICE_CPU or a CUDA
   * device); evict_on: the place whose replica goes; map_gpu: the CUDA device (>= 0);
   * load_places: NWC_LOAD_PIN and NWC_LOAD_SPLIT, and the places as a mask (NWC_PLACE_BIT) */
  uint8_t load_flags;
  int32_t device;
  uint64_t places;
  /* matvec_ipc (x: in_off, x_bytes; y: out_off, out_cap), dequant_ipc (y: out_off, out_cap):
   * the client's buffers as cudaIpcMemHandle_t bytes, and optionally an event to wait for */
  uint8_t has_event;
  uint8_t ipc_x[NWC_PROTO_IPC_HANDLE], ipc_y[NWC_PROTO_IPC_HANDLE], ipc_event[NWC_PROTO_IPC_HANDLE];
  /* pull (ref, model: the local name, "" for the artifact's), push (model, ref): the registry
   * reference, the client's credentials for it ("" for none) and NWC_REGISTRY_* flags */
  char ref[NWC_PROTO_NAME_MAX];
  char user[256];
  char secret[NWC_PROTO_SECRET_MAX];
  uint8_t registry_flags;
} nwc_proto_req;

/* pull and push flags. */
#define NWC_REGISTRY_PLAIN_HTTP 1u /* http:// (a registry on localhost, tests); else https */
#define NWC_REGISTRY_KNOWN 1u

/* import2 flags. */
#define NWC_IMPORT_STRICT 1u /* all or nothing: a tensor nwc does not store fails the import */
#define NWC_IMPORT_KNOWN 1u

/* Encodes r as a complete frame into w (nwc_pw_init first).  Returns the frame size or <0. */
int64_t nwc_proto_req_encode(const nwc_proto_req *r, nwc_pw *w);
/* Decodes the payload of a request frame with header h into r (zeroed first).  Pointers in r
 * (rows, x) point into payload.  Returns 0, -EBADMSG for a malformed payload (exact length,
 * strings, counts), -EOPNOTSUPP for an unknown opcode (detail says which). */
int nwc_proto_req_decode(const nwc_proto_hdr *h, const uint8_t *payload, nwc_proto_req *r);
void nwc_proto_req_clear(nwc_proto_req *r);

/* ---- replies ------------------------------------------------------------------------------ */

typedef struct nwc_proto_hello {
  uint32_t version;
  uint64_t caps;
  uint32_t max_payload;
  char daemon[64];
  char backend[16];
} nwc_proto_hello;
void nwc_proto_put_hello(nwc_pw *w, const nwc_proto_hello *h);
int nwc_proto_get_hello(nwc_pr *r, nwc_proto_hello *h);

typedef struct nwc_proto_model {
  char name[NWC_PROTO_NAME_MAX];
  uint64_t tensors, raw_bytes, nwc_bytes, resident_bytes;
  int64_t created, verified;
} nwc_proto_model;
void nwc_proto_put_model(nwc_pw *w, const nwc_proto_model *m);
int nwc_proto_get_model(nwc_pr *r, nwc_proto_model *m);

/* Residency states reported for a tensor. */
enum { NWC_RES_ABSENT = 0, NWC_RES_LOADING = 1, NWC_RES_RESIDENT = 2 };

typedef struct nwc_proto_tensor {
  char name[NWC_PROTO_NAME_MAX];
  uint8_t ndim;
  uint64_t shape[8];
  char dtype[12];
  uint32_t elem;
  uint64_t rows, cols, raw_bytes, nwc_bytes;
  uint8_t state, pinned;
  uint32_t refs;
  int64_t last_used_ms; /* ms since last use, -1 never */
} nwc_proto_tensor;
void nwc_proto_put_tensor(nwc_pw *w, const nwc_proto_tensor *t);
int nwc_proto_get_tensor(nwc_pr *r, nwc_proto_tensor *t);

/* Info: a tensor entry followed by these. */
typedef struct nwc_proto_info {
  char conversion[64];
  char path[1024];
  uint64_t offset, length, nchunks, nblocks, data_bytes;
  uint32_t format_version;
} nwc_proto_info;
void nwc_proto_put_info(nwc_pw *w, const nwc_proto_info *i);
int nwc_proto_get_info(nwc_pr *r, nwc_proto_info *i);

/* PS: one resident tensor. */
typedef struct nwc_proto_ps {
  char model[NWC_PROTO_NAME_MAX];
  char tensor[NWC_PROTO_NAME_MAX];
  uint64_t bytes;
  uint8_t pinned, locked, direct;
  uint32_t refs;
  int64_t last_used_ms;
  uint32_t maps; /* client mappings (map) holding it */
  int32_t device; /* NWC_DEVICE_CPU or the CUDA device */
} nwc_proto_ps;
void nwc_proto_put_ps(nwc_pw *w, const nwc_proto_ps *p);
int nwc_proto_get_ps(nwc_pr *r, nwc_proto_ps *p);

/* Counts of load, evict, pin, unpin, import, remove, verify (fields unused by an op are 0). */
typedef struct nwc_proto_result {
  uint64_t tensors, bytes, skipped, micros;
  uint64_t direct, buffered; /* load: tensors read with O_DIRECT / buffered */
  uint64_t raw_bytes;        /* import */
  uint64_t chunks, problems; /* verify */
} nwc_proto_result;
void nwc_proto_put_result(nwc_pw *w, const nwc_proto_result *r);
int nwc_proto_get_result(nwc_pr *r, nwc_proto_result *o);

/* import2 replies: the result, then u32 n (at most NWC_PROTO_MAX_SKIPPED; result.skipped counts
 * them all) and n of these, the tensors left out. */
typedef struct nwc_proto_skipped {
  char name[NWC_PROTO_NAME_MAX];
  char dtype[12];
  uint8_t ndim; /* <= 8 */
  uint64_t shape[8];
} nwc_proto_skipped;
void nwc_proto_put_skipped(nwc_pw *w, const nwc_proto_skipped *s);
int nwc_proto_get_skipped(nwc_pr *r, nwc_proto_skipped *s);

/* Progress events: done of total. */
void nwc_proto_put_progress(nwc_pw *w, uint64_t done, uint64_t total);
int nwc_proto_get_progress(nwc_pr *r, uint64_t *done, uint64_t *total);

/* Compute replies (dequant, gather, matvec) start with this; inline data follows. */
typedef struct nwc_proto_compute {
  uint64_t rows, cols; /* output shape: dequant M x K, gather n x K, matvec ncols x M */
  uint8_t out, where;
  uint16_t rflags; /* NWC_RF_* */
  uint64_t bytes;  /* output bytes (inline after this header, or at out_off in the region) */
} nwc_proto_compute;
void nwc_proto_put_compute(nwc_pw *w, const nwc_proto_compute *c);
int nwc_proto_get_compute(nwc_pr *r, nwc_proto_compute *c);

/* Map: what a client needs to decode a shared resident tensor in its own process.  The memfd
 * travels separately (docs/protocol.md, "map"): its first length bytes are the tensor's blob, and
 * these fields are the catalog's decoder parameters for it (nwc_tensor_info), which the client
 * checks against the blob header (nwc_store_blob_view). */
#define NWC_PROTO_MAP_TOKEN 8 /* bytes sent with the memfd: the map request's id, u64 */
typedef struct nwc_proto_map {
  uint64_t size;   /* bytes of the memfd */
  uint64_t length; /* bytes of the blob at offset 0 (<= size) */
  uint32_t format_version, elem;
  uint64_t container, rows, cols, nblocks, data_bytes, raw_plane_bytes;
  uint8_t psym[16];
  uint64_t off_bases, off_hdr, off_data, off_raw, off_scale; /* off_scale 0: no per-row scale */
  uint32_t maps;  /* mappings of the tensor now, this one included */
  uint8_t locked; /* the daemon's copy is mlock'ed */
} nwc_proto_map;
void nwc_proto_put_map(nwc_pw *w, const nwc_proto_map *m);
int nwc_proto_get_map(nwc_pr *r, nwc_proto_map *m);
/* The map socket's one message: the token with the memfd (SCM_RIGHTS).  send never blocks
 * (-EAGAIN when the socket is full); recv takes what is already queued, checks the token, and
 * returns the descriptor (O_CLOEXEC) in *memfd: 0, or -EBADMSG when nothing or something else
 * came. */
int nwc_proto_map_send(int sock, int memfd, uint64_t token);
int nwc_proto_map_recv(int sock, uint64_t token, int *memfd);

/* map_gpu: device copies shared with a client (docs/gpu-maps.md).  The daemon's memory pool of
 * the device travels over the passed socket as the map socket's one message (nwc_proto_map_send
 * with the pool's descriptor); the reply holds the head, then n tensors.  Offsets are from the
 * start of the tensor's allocation (as cudaMemPoolImportPointer returns it): the lookup table at
 * off_tab, the blob's arrays after it; off_scale 0: no per-row scale. */
#define NWC_PROTO_GMAP_EXPORT 64 /* bytes of a cudaMemPoolPtrExportData */
#define NWC_PROTO_GMAP_MAX 65536 /* tensors of one map_gpu reply */
typedef struct nwc_proto_gmap_head {
  uint64_t pool_id; /* names the daemon's pool for its life: a client imports it once */
  int32_t device;
  uint8_t uuid[16]; /* the device's (cudaDeviceProp.uuid): ordinals differ between processes */
  uint32_t n;
} nwc_proto_gmap_head;
typedef struct nwc_proto_gmap {
  char name[NWC_PROTO_NAME_MAX];
  uint32_t elem;
  uint64_t rows, cols, nblocks;
  uint8_t psym[16];
  uint8_t export_data[NWC_PROTO_GMAP_EXPORT];
  uint64_t bytes; /* of the allocation */
  uint64_t off_tab, off_bases, off_hdr, off_data, off_raw, off_scale;
  uint32_t maps; /* mappings of the tensor now, this one included */
} nwc_proto_gmap;
void nwc_proto_put_gmap_head(nwc_pw *w, const nwc_proto_gmap_head *h);
int nwc_proto_get_gmap_head(nwc_pr *r, nwc_proto_gmap_head *h);
void nwc_proto_put_gmap(nwc_pw *w, const nwc_proto_gmap *g);
/* Checks every offset against bytes (-EBADMSG). */
int nwc_proto_get_gmap(nwc_pr *r, nwc_proto_gmap *g);

typedef struct nwc_proto_stats {
  uint64_t uptime_ms, connections, conn_total, requests, errors;
  uint64_t budget, resident_bytes, pinned_bytes, resident_tensors;
  uint64_t loads, load_bytes, load_us, direct_loads, buffered_loads, evictions;
  uint64_t mlock_ok, mlock_failed, mapped_computes, batched_passes, batched_columns;
  uint64_t threads;
  uint64_t gpu_budget, gpu_resident_bytes; /* summed over the CUDA devices */
  char backend[16];
} nwc_proto_stats;
void nwc_proto_put_stats(nwc_pw *w, const nwc_proto_stats *s);
int nwc_proto_get_stats(nwc_pr *r, nwc_proto_stats *s);

/* Devices: one place where tensors live (u32 n, then n of these: the host, then each GPU). */
#define NWC_PROTO_PLACE_NAME 16 /* "cpu", "cuda:N": bytes with the NUL */
typedef struct nwc_proto_place {
  char name[NWC_PROTO_PLACE_NAME];
  uint64_t budget;
  uint64_t resident_bytes, resident_tensors, pinned_bytes; /* as ps counts them */
  uint64_t mem_free, mem_total; /* host: MemAvailable, MemTotal; GPU: cudaMemGetInfo; 0 unknown */
  uint64_t pool_idle;           /* GPU: bytes its copy pool keeps beyond the live copies; host 0 */
} nwc_proto_place;
void nwc_proto_put_place(nwc_pw *w, const nwc_proto_place *p);
int nwc_proto_get_place(nwc_pr *r, nwc_proto_place *p);

#endif
