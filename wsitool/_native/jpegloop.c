/* wsitool._jpegloop: the per-tile loop of a JPEG region read, in C.
 *
 * What it does, for one thread and a range of the tiles of one region:
 * read each tile's bytes with pread() behind the level's JPEG prefix
 * (SOI + Adobe marker + JPEGTables, built by wsitool.formats.tiff.encoding; or, for the
 * restart intervals of a Hamamatsu NDPI level, "scan segments", the whole
 * header SOI..SOS in front of the bare segment, whose final RSTn marker
 * becomes EOI: see TileEncoding.jpeg_scan_segments), check them
 * (segment inside the file, full read, SOI, a header nvImageCodec can parse,
 * header size equal to the tile grid cell, wanted rectangle inside the tile),
 * then decode the wanted window of each with libjpeg-turbo's libjpeg API
 * straight into the caller's output (lj_decode: corrupt entropy-coded data,
 * which libjpeg only warns about and nvImageCodec's CPU backend lets through,
 * fails the tile).  NDPI restart intervals without chroma subsampling are
 * decoded a band at a time, spliced into one code stream (see splice_band),
 * where they can be.  decode_jpeg() is the same decode for the Python path.
 *
 * It is the same plan and the same checks as the Python path in
 * wsitool/read/worker.py (TileWorker), wsitool/codec/tilebytes.py
 * (read_tile_stream) and wsitool/codec/nvdecode.py (plan_decode), which stays
 * the reference: tests pin this loop to it pixel for pixel and error for
 * error, and the decode to nvImageCodec's (tests/codec/test_libjpeg.py).  Only
 * the per-tile Python calls (about 30 us a tile against about 300-600 us of
 * decoding) are gone, and the GIL is released for the whole call.
 *
 * Neither library is linked.  libjpeg-turbo: compiled against its API-62 headers
 * (third_party/libjpeg-turbo/include, so no jpeglib.h need be installed), loaded by
 * load_libjpeg() from the path wsitool.codec.jpegloop chooses (Pillow's bundled
 * libjpeg-turbo, or the system's libjpeg.so.62), its functions looked up with dlsym;
 * jpeg_CreateDecompress refuses a library of another API or structure size, and
 * load_libjpeg() then refuses it.  nvImageCodec: wsitool.codec.jpegloop passes the
 * path of the libnvimgcodec.so.0 that the nvidia-nvimgcodec package loaded, and the
 * functions are looked up with dlsym.  The version the library reports must equal
 * the version of the header this file was compiled with (the structure layouts are
 * that header's), else load() refuses and wsitool keeps its Python path.
 *
 * Errors are not raised from here: each failed tile is zero-filled in the
 * output (transparent background, as the Python path does) and reported as
 * (job index, code, a, b, message); wsitool.codec.jpegloop turns that into the
 * same TileDecodeError message the Python path gives.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <stddef.h> /* nvimgcodec.h uses ptrdiff_t without including it */
#include <errno.h>
#include <setjmp.h>
#include <stdio.h> /* jpeglib.h uses FILE and size_t */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "nvimgcodec.h"
#include <jpeglib.h>
#include <jerror.h>

/* libjpeg-turbo's functions, looked up in the library load_libjpeg() opens (none is linked:
 * the names below stand for the pointers, so the decode reads as libjpeg's API). */
static struct {
    void* lib;
    struct jpeg_error_mgr* (*std_error)(struct jpeg_error_mgr*);
    void (*create_decompress)(j_decompress_ptr, int, size_t);
    void (*destroy_decompress)(j_decompress_ptr);
    void (*mem_src)(j_decompress_ptr, const unsigned char*, unsigned long);
    int (*read_header)(j_decompress_ptr, boolean);
    void (*calc_output_dimensions)(j_decompress_ptr);
    boolean (*start_decompress)(j_decompress_ptr);
    void (*crop_scanline)(j_decompress_ptr, JDIMENSION*, JDIMENSION*);
    JDIMENSION (*skip_scanlines)(j_decompress_ptr, JDIMENSION);
    JDIMENSION (*read_scanlines)(j_decompress_ptr, JSAMPARRAY, JDIMENSION);
    boolean (*finish_decompress)(j_decompress_ptr);
} lj;

#define jpeg_std_error (*lj.std_error)
#define jpeg_CreateDecompress (*lj.create_decompress)
#define jpeg_destroy_decompress (*lj.destroy_decompress)
#define jpeg_mem_src (*lj.mem_src)
#define jpeg_read_header (*lj.read_header)
#define jpeg_calc_output_dimensions (*lj.calc_output_dimensions)
#define jpeg_start_decompress (*lj.start_decompress)
#define jpeg_crop_scanline (*lj.crop_scanline)
#define jpeg_skip_scanlines (*lj.skip_scanlines)
#define jpeg_read_scanlines (*lj.read_scanlines)
#define jpeg_finish_decompress (*lj.finish_decompress)

static int lj_loaded(void);

/* Failure codes, exported to Python as F_* module constants (wsitool/codec/jpegloop.py reads them). */
enum {
    F_PAST_EOF = 1,    /* a = offset, b = byte count */
    F_SHORT_READ = 2,  /* a = bytes read, b = byte count */
    F_IO_ERROR = 3,    /* a = errno */
    F_NOT_SOI = 4,     /* a = first two bytes (big-endian), b = how many there were */
    F_HEADER = 5,      /* a = nvImageCodec status */
    F_GRID = 6,        /* a = declared width, b = declared height */
    F_OUTSIDE = 7,     /* a = declared width, b = declared height */
    F_SUBSTREAM = 8,   /* a = nvImageCodec status */
    F_IMAGE = 9,       /* a = nvImageCodec status */
    F_DECODE = 10,     /* libjpeg-turbo's message in the failure's msg */
    F_NO_SEGMENT = 11, /* a = segment index, b = number of segments */
    F_NO_MEMORY = 12,
};

#define MAX_BATCH 64
/* Largest magnitude accepted for a size or coordinate (2^48 pixels: far beyond
 * any TIFF's 32-bit sizes), so that no sum or difference of them overflows int64. */
#define COORD_MAX ((int64_t)1 << 48)
/* Largest tile-bytes or RGB buffer a decoder keeps between calls (as wsitool.codec.pool._READ_BUFFER_KEEP). */
#define KEEP_BYTES ((size_t)16 << 20)
#define IS_LITTLE_ENDIAN (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)

typedef nvimgcodecStatus_t (*GetProperties_t)(nvimgcodecProperties_t*);
typedef nvimgcodecStatus_t (*InstanceCreate_t)(nvimgcodecInstance_t*, const nvimgcodecInstanceCreateInfo_t*);
typedef nvimgcodecStatus_t (*StreamFromMem_t)(nvimgcodecInstance_t, nvimgcodecCodeStream_t*,
                                              const unsigned char*, size_t, const nvimgcodecCodeStreamView_t*);
typedef nvimgcodecStatus_t (*StreamDestroy_t)(nvimgcodecCodeStream_t);
typedef nvimgcodecStatus_t (*StreamImageInfo_t)(nvimgcodecCodeStream_t, nvimgcodecImageInfo_t*);

static struct {
    void* lib;
    GetProperties_t get_properties;
    InstanceCreate_t instance_create;
    StreamFromMem_t stream_from_mem;
    StreamDestroy_t stream_destroy;
    StreamImageInfo_t stream_image_info;
    nvimgcodecInstance_t instance;
    unsigned version;
} api;

static void* need(const char* name, int* missing)
{
    void* f = dlsym(api.lib, name);
    if (f == NULL)
        *missing = 1;
    return f;
}

static PyObject* jl_load(PyObject* self, PyObject* args)
{
    const char* lib_path;
    const char* ext_path;
    if (!PyArg_ParseTuple(args, "ss", &lib_path, &ext_path))
        return NULL;
    if (api.instance != NULL)
        return PyLong_FromUnsignedLong(api.version);
    void* lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "cannot load %s: %s", lib_path, dlerror());
        return NULL;
    }
    api.lib = lib;
    int missing = 0;
    api.get_properties = (GetProperties_t)need("nvimgcodecGetProperties", &missing);
    api.instance_create = (InstanceCreate_t)need("nvimgcodecInstanceCreate", &missing);
    api.stream_from_mem = (StreamFromMem_t)need("nvimgcodecCodeStreamCreateFromHostMem", &missing);
    api.stream_destroy = (StreamDestroy_t)need("nvimgcodecCodeStreamDestroy", &missing);
    api.stream_image_info = (StreamImageInfo_t)need("nvimgcodecCodeStreamGetImageInfo", &missing);
    if (missing) {
        PyErr_Format(PyExc_ImportError, "%s lacks functions of the nvImageCodec C API", lib_path);
        return NULL;
    }
    nvimgcodecProperties_t props;
    memset(&props, 0, sizeof props);
    props.struct_type = NVIMGCODEC_STRUCTURE_TYPE_PROPERTIES;
    props.struct_size = sizeof props;
    if (api.get_properties(&props) != NVIMGCODEC_STATUS_SUCCESS) {
        PyErr_SetString(PyExc_ImportError, "nvimgcodecGetProperties failed");
        return NULL;
    }
    if (props.version != NVIMGCODEC_VER) {
        PyErr_Format(PyExc_ImportError,
                     "libnvimgcodec is version %u, this extension was built for %u",
                     props.version, (unsigned)NVIMGCODEC_VER);
        return NULL;
    }
    nvimgcodecInstanceCreateInfo_t info;
    memset(&info, 0, sizeof info);
    info.struct_type = NVIMGCODEC_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    info.struct_size = sizeof info;
    info.load_builtin_modules = 1;
    info.load_extension_modules = 1;
    info.extension_modules_path = ext_path;
    info.create_debug_messenger = 0;
    nvimgcodecInstance_t instance = NULL;
    nvimgcodecStatus_t st = api.instance_create(&instance, &info);
    if (st != NVIMGCODEC_STATUS_SUCCESS || instance == NULL) {
        PyErr_Format(PyExc_ImportError, "nvimgcodecInstanceCreate failed (status %d)", (int)st);
        return NULL;
    }
    /* The instance lives as long as the process (like the Python binding's). */
    api.instance = instance;
    api.version = props.version;
    return PyLong_FromUnsignedLong(api.version);
}

/* Test hook: the next N batch decode calls (of more than one tile) fail as a
 * whole without decoding, so the tests can reach the tile-by-tile retry. */
/* ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    int ready; /* __init__ ran (after load()) */
    pthread_mutex_t mutex;
    /* the tile bytes of one call, one after another: one buffer per thread, grown
     * by doubling to the largest call's total (one per batch slot, each at least
     * 64 KiB, grew slot by slot all through a long run of many threads) */
    unsigned char* arena;
    size_t arena_cap;
    unsigned char* rgb_buf[MAX_BATCH];
    size_t rgb_cap[MAX_BATCH];
    /* one output row of a crop whose libjpeg window is wider than the wanted part */
    unsigned char* row;
    size_t row_cap;
} Decoder;

static int Decoder_init(Decoder* self, PyObject* args, PyObject* kwds)
{
    if (api.instance == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "wsitool._jpegloop.load() was not called");
        return -1;
    }
    if (!lj_loaded())
        return -1;
    self->ready = 1;
    return 0;
}

static PyObject* Decoder_new(PyTypeObject* type, PyObject* args, PyObject* kwds)
{
    Decoder* self = (Decoder*)type->tp_alloc(type, 0);
    if (self != NULL)
        pthread_mutex_init(&self->mutex, NULL);
    return (PyObject*)self;
}

static void Decoder_dealloc(Decoder* self)
{
    free(self->arena);
    free(self->row);
    for (int i = 0; i < MAX_BATCH; i++)
        free(self->rgb_buf[i]);
    pthread_mutex_destroy(&self->mutex);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

/* Grow buffer *buf (capacity *cap) to at least n bytes, counting each
 * allocation in *allocations; 0 on failure. */
static int reserve(unsigned char** buf, size_t* cap, size_t n, long long* allocations)
{
    if (*cap >= n)
        return 1;
    ++*allocations;
    size_t want = n < 65536 ? 65536 : n;
    if (want < 2 * *cap)
        want = 2 * *cap;
    unsigned char* p = (unsigned char*)malloc(want);
    if (p == NULL)
        return 0;
    free(*buf);
    *buf = p;
    *cap = want;
    return 1;
}

typedef struct {
    /* level geometry */
    int64_t tile_w, tile_h, level_w, level_h, across, file_size;
    const int64_t* offsets;
    const int64_t* counts;
    Py_ssize_t n_segments;
    int fd; /* -1: the bytes come from the extents below (a remote slide's fetched ranges) */
    Py_ssize_t n_ext;
    const int64_t* ext_start; /* ascending */
    const int64_t* ext_len;
    const unsigned char* const* ext_ptr;
    const unsigned char* prefix;
    size_t prefix_len;
    int scan_segments; /* the tiles are NDPI restart intervals: no SOI, prefix goes in front whole */
    /* region and output */
    int64_t rx, ry, cx0, cy0, cx1, cy1, c0, r0, ncols;
    unsigned char* out;
    int64_t out_w, out_h, channels;
} Plan;

/* Read count bytes at offset into buf: pread() of the file, or (fd < 0) a copy from the
 * fetched extent that holds them.  Returns the bytes read, or -1 with errno set. */
static ssize_t read_at(const Plan* p, unsigned char* buf, size_t count, int64_t offset)
{
    if (p->fd >= 0)
        return pread(p->fd, buf, count, (off_t)offset);
    Py_ssize_t lo = 0, hi = p->n_ext; /* the first extent starting after offset */
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (p->ext_start[mid] <= offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (Py_ssize_t i = lo - 1; i >= 0 && i >= lo - 8; i--) { /* (extents may overlap) */
        int64_t at = offset - p->ext_start[i];
        if (at >= 0 && (uint64_t)at + count <= (uint64_t)p->ext_len[i]) {
            memcpy(buf, p->ext_ptr[i] + at, count);
            return (ssize_t)count;
        }
    }
    errno = ENODATA;
    return -1;
}

typedef struct {
    Py_ssize_t job;
    int code;
    long long a, b;
    char msg[JMSG_LENGTH_MAX]; /* F_DECODE: libjpeg-turbo's message */
} Failure;

typedef struct {
    long long direct, roi, scratch, missing, bytes_read, decoded, allocations, spliced;
    Failure* failures;
    Py_ssize_t n_failures, cap_failures;
    int oom;
} Tally;

typedef struct {
    Py_ssize_t job;
    int how; /* 0 direct, 1 roi */
    int64_t dy0, dy1, dx0, dx1;
    nvimgcodecCodeStream_t stream; /* for the header check only */
    unsigned char* rgb; /* RGBA output: the RGB scratch decoded into */
    const unsigned char* data; /* the complete code stream (in the arena) */
    size_t len;
    int64_t sx0, sy0, sx1, sy1; /* the wanted rectangle of the tile */
    unsigned char* target;      /* where its pixel (sx0, sy0) goes; rows `stride` bytes apart */
    size_t stride;
} Pending;

static void zero_rect(const Plan* p, int64_t dy0, int64_t dy1, int64_t dx0, int64_t dx1)
{
    size_t row_bytes = (size_t)(p->out_w * p->channels);
    size_t n = (size_t)((dx1 - dx0) * p->channels);
    for (int64_t y = dy0; y < dy1; y++)
        memset(p->out + (size_t)y * row_bytes + (size_t)(dx0 * p->channels), 0, n);
}

static void fail(Tally* t, const Plan* p, Py_ssize_t job, int code, long long a, long long b,
                 int64_t dy0, int64_t dy1, int64_t dx0, int64_t dx1)
{
    zero_rect(p, dy0, dy1, dx0, dx1);
    if (t->n_failures == t->cap_failures) {
        Py_ssize_t cap = t->cap_failures ? 2 * t->cap_failures : 8;
        Failure* f = (Failure*)realloc(t->failures, (size_t)cap * sizeof(Failure));
        if (f == NULL) {
            t->oom = 1;
            return;
        }
        t->failures = f;
        t->cap_failures = cap;
    }
    Failure* f = &t->failures[t->n_failures++];
    f->job = job;
    f->code = code;
    f->a = a;
    f->b = b;
    f->msg[0] = '\0';
}

/* fail() with F_DECODE and libjpeg-turbo's message. */
static void fail_decode(Tally* t, const Plan* p, const Pending* e, const char* msg)
{
    Py_ssize_t before = t->n_failures;
    fail(t, p, e->job, F_DECODE, 0, 0, e->dy0, e->dy1, e->dx0, e->dx1);
    if (t->n_failures > before)
        snprintf(t->failures[before].msg, JMSG_LENGTH_MAX, "%s", msg);
}

static void release(Pending* q)
{
    if (q->stream != NULL)
        api.stream_destroy(q->stream);
    q->stream = NULL;
}

/* Write the (h, w, 3) RGB pixels at rgb into the output as opaque RGBA
 * (one 32-bit store per pixel; the output rows are 4-byte aligned when the
 * buffer is, and memcpy keeps it correct when it is not). */
static void widen(const Plan* p, const unsigned char* rgb, int64_t dy0, int64_t dy1, int64_t dx0, int64_t dx1)
{
    int64_t w = dx1 - dx0;
    size_t row_bytes = (size_t)(p->out_w * 4);
    for (int64_t y = dy0; y < dy1; y++) {
        unsigned char* d = p->out + (size_t)y * row_bytes + (size_t)dx0 * 4;
        const unsigned char* s = rgb + (size_t)(y - dy0) * (size_t)w * 3;
        for (int64_t x = 0; x < w; x++) {
            uint32_t v = (uint32_t)s[3 * x] | ((uint32_t)s[3 * x + 1] << 8) | ((uint32_t)s[3 * x + 2] << 16)
                         | 0xFF000000u;
            if (!IS_LITTLE_ENDIAN)
                v = __builtin_bswap32(v);
            memcpy(d + 4 * x, &v, 4);
        }
    }
}

/* ------------------------------------------------------------------------
 * The decode itself: libjpeg-turbo's libjpeg API, straight into the caller's rows.
 *
 * nvImageCodec's CPU JPEG backend is libjpeg-turbo too, but it reports success
 * when libjpeg only warns, and libjpeg warns (and goes on, filling in what it
 * cannot read) for corrupt entropy-coded data: a marker where Huffman data should
 * be ("premature end of data segment"), bytes left over before a marker, a bad
 * Huffman code, a restart marker out of sequence (jerror.h, the JWRN_ codes).  Such
 * a tile decodes to wrong pixels without a word.  Here every one of those warnings
 * ends the decode as an error, with libjpeg's own message (as OpenSlide treats
 * libjpeg warnings).  Warnings about metadata (an unknown JFIF revision or Adobe
 * transform code) do not touch pixels and are ignored.
 *
 * The window: jpeg_crop_scanline() for the columns (it widens them to whole iMCU
 * columns), jpeg_skip_scanlines() for the rows above it, as nvImageCodec's backend
 * does, so the pixels are the ones its ROI decode gives (tests pin them). */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char* msg; /* JMSG_LENGTH_MAX bytes */
} LjError;

static void lj_error_exit(j_common_ptr c)
{
    LjError* e = (LjError*)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jump, 1);
}

/* 1 for the warnings that mean the entropy-coded data (the pixels) is corrupt. */
static int lj_corrupt_data(int code)
{
    switch (code) {
    case JWRN_HIT_MARKER:      /* premature end of data segment */
    case JWRN_EXTRANEOUS_DATA: /* N extraneous bytes before marker */
    case JWRN_HUFF_BAD_CODE:   /* bad Huffman code */
    case JWRN_ARITH_BAD_CODE:
    case JWRN_JPEG_EOF:        /* premature end of JPEG file */
    case JWRN_MUST_RESYNC:     /* restart marker out of sequence */
    case JWRN_NOT_SEQUENTIAL:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_TOO_MUCH_DATA:
        return 1;
    default:
        return 0;
    }
}

static void lj_emit_message(j_common_ptr c, int level)
{
    if (level < 0) {
        if (lj_corrupt_data(c->err->msg_code))
            lj_error_exit(c);
        c->err->num_warnings++;
    }
    /* trace messages (level >= 0): nothing */
}

/* Route c's errors to err: libjpeg's message into msg (JMSG_LENGTH_MAX bytes, emptied here), then a
 * longjmp to err->jump, which the caller set with setjmp (it must be the caller's: a jmp_buf is only
 * valid while the frame that set it runs); warnings of corrupt data are errors (lj_emit_message). */
static void lj_error_init(struct jpeg_decompress_struct* c, LjError* err, char* msg)
{
    c->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = lj_error_exit;
    err->pub.emit_message = lj_emit_message;
    err->msg = msg;
    msg[0] = '\0';
}

/* Decode the rectangle [sx0, sx1) x [sy0, sy1) of the JPEG code stream data[0, n),
 * at scale 1 / 2**scale_log2 (0 to 3: libjpeg's DCT scaling, 8 x 8 blocks decoded as 4 x 4,
 * 2 x 2 or 1 x 1; the rectangle in pixels of that scale), as RGB into target (its pixel (sx0, sy0) first, rows stride bytes apart).  *row is a
 * scratch of *row_cap bytes for one output row of a crop wider than the rectangle,
 * grown here (before the decode starts; counted in *allocations).  1 when decoded;
 * 0 with libjpeg's message (or why) in msg, JMSG_LENGTH_MAX bytes, when not: the
 * rectangle's pixels are then undefined. */
static int lj_decode(const unsigned char* data, size_t n, int scale_log2, int64_t sx0, int64_t sy0, int64_t sx1,
                     int64_t sy1, unsigned char* target, size_t stride, unsigned char** row, size_t* row_cap,
                     long long* allocations, char* msg)
{
    struct jpeg_decompress_struct c;
    LjError err;
    lj_error_init(&c, &err, msg);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&c);
        return 0;
    }
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, data, (unsigned long)n);
    jpeg_read_header(&c, TRUE);
    c.out_color_space = JCS_RGB;
    c.scale_num = 1;
    c.scale_denom = 1u << scale_log2;
    jpeg_calc_output_dimensions(&c);
    if ((int64_t)c.output_width < sx1 || (int64_t)c.output_height < sy1) {
        snprintf(msg, JMSG_LENGTH_MAX, "the frame (%u x %u at 1/%u) does not hold the window", c.output_width,
                 c.output_height, c.scale_denom);
        jpeg_destroy_decompress(&c);
        return 0;
    }
    /* the crop scratch: one row of the widest window, reserved before any decoding (no
     * allocation between setjmp and a longjmp) */
    size_t need = (size_t)c.output_width * 3;
    if (!reserve(row, row_cap, need, allocations)) {
        snprintf(msg, JMSG_LENGTH_MAX, "no memory for a %zu-byte row", need);
        jpeg_destroy_decompress(&c);
        return 0;
    }
    jpeg_start_decompress(&c);
    JDIMENSION xoff = 0, width = c.output_width;
    /* a window one column wide at the left edge: decoded whole-width (the crop would
     * lose the fancy upsampling; wsitool.codec.nvdecode.narrow_jpeg_crop) */
    int narrow = sx0 == 0 && sx1 == 1 && c.output_width > 1;
    if (!narrow && (sx0 > 0 || sx1 < (int64_t)c.output_width)) {
        /* one column more on each side that has one: jpeg_crop_scanline() aligns the
         * window to iMCU columns, and a window edge on an iMCU boundary would otherwise
         * be upsampled without the chroma beyond it (pixels off the whole-tile decode,
         * by up to 3 levels on 4:2:0 tiles; nvImageCodec's backend widens the same way) */
        int64_t left = sx0 > 0 ? sx0 - 1 : 0, right = sx1 < (int64_t)c.output_width ? sx1 + 1 : sx1;
        xoff = (JDIMENSION)left;
        width = (JDIMENSION)(right - left);
        jpeg_crop_scanline(&c, &xoff, &width);
    }
    int direct = (int64_t)xoff == sx0 && (int64_t)width == sx1 - sx0;
    if (sy0 > 0 && jpeg_skip_scanlines(&c, (JDIMENSION)sy0) != (JDIMENSION)sy0) {
        snprintf(msg, JMSG_LENGTH_MAX, "could not skip to row %lld", (long long)sy0);
        jpeg_destroy_decompress(&c);
        return 0;
    }
    size_t wanted = (size_t)(sx1 - sx0) * 3, skip = (size_t)(sx0 - (int64_t)xoff) * 3;
    JSAMPROW rows[16];
    while ((int64_t)c.output_scanline < sy1) {
        int64_t y = (int64_t)c.output_scanline - sy0;
        JDIMENSION got;
        if (direct) {
            int64_t k = sy1 - (int64_t)c.output_scanline;
            if (k > 16)
                k = 16;
            for (int64_t i = 0; i < k; i++)
                rows[i] = target + (size_t)(y + i) * stride;
            got = jpeg_read_scanlines(&c, rows, (JDIMENSION)k);
        } else {
            rows[0] = *row;
            got = jpeg_read_scanlines(&c, rows, 1);
            if (got == 1)
                memcpy(target + (size_t)y * stride, *row + skip, wanted);
        }
        if (got == 0) {
            snprintf(msg, JMSG_LENGTH_MAX, "no rows after row %u", c.output_scanline);
            jpeg_destroy_decompress(&c);
            return 0;
        }
    }
    /* the whole frame read: finishing reads up to EOI, so bytes left over after the
     * last MCU are reported too; a window above the bottom stops here */
    if (c.output_scanline >= c.output_height)
        jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    return 1;
}

/* load_libjpeg(path): open libjpeg-turbo at path and look up its functions (once; a second
 * call with another path returns the first's).  The library must be libjpeg-turbo (it has
 * jpeg_skip_scanlines and jpeg_crop_scanline) of the API these headers are (62), with the
 * decompressor structure of their size: a test decompressor is created to let the library
 * itself check both (jpeg_CreateDecompress fails with its own message otherwise). */
static PyObject* jl_load_libjpeg(PyObject* self, PyObject* args)
{
    const char* path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    if (lj.lib != NULL)
        return PyLong_FromLong(JPEG_LIB_VERSION);
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "cannot load %s: %s", path, dlerror());
        return NULL;
    }
    const char* names[] = {"jpeg_std_error", "jpeg_CreateDecompress", "jpeg_destroy_decompress", "jpeg_mem_src",
                           "jpeg_read_header", "jpeg_calc_output_dimensions", "jpeg_start_decompress",
                           "jpeg_crop_scanline", "jpeg_skip_scanlines", "jpeg_read_scanlines",
                           "jpeg_finish_decompress"};
    void* found[11];
    for (int i = 0; i < 11; i++) {
        found[i] = dlsym(lib, names[i]);
        if (found[i] == NULL) {
            PyErr_Format(PyExc_ImportError, "%s is not libjpeg-turbo's libjpeg API: it has no %s", path, names[i]);
            dlclose(lib);
            return NULL;
        }
    }
    lj.std_error = (struct jpeg_error_mgr * (*)(struct jpeg_error_mgr*)) found[0];
    lj.create_decompress = (void (*)(j_decompress_ptr, int, size_t))found[1];
    lj.destroy_decompress = (void (*)(j_decompress_ptr))found[2];
    lj.mem_src = (void (*)(j_decompress_ptr, const unsigned char*, unsigned long))found[3];
    lj.read_header = (int (*)(j_decompress_ptr, boolean))found[4];
    lj.calc_output_dimensions = (void (*)(j_decompress_ptr))found[5];
    lj.start_decompress = (boolean(*)(j_decompress_ptr))found[6];
    lj.crop_scanline = (void (*)(j_decompress_ptr, JDIMENSION*, JDIMENSION*))found[7];
    lj.skip_scanlines = (JDIMENSION(*)(j_decompress_ptr, JDIMENSION))found[8];
    lj.read_scanlines = (JDIMENSION(*)(j_decompress_ptr, JSAMPARRAY, JDIMENSION))found[9];
    lj.finish_decompress = (boolean(*)(j_decompress_ptr))found[10];
    /* the library checks the API version and the structure's size itself */
    struct jpeg_decompress_struct c;
    LjError err;
    char msg[JMSG_LENGTH_MAX];
    lj_error_init(&c, &err, msg);
    if (setjmp(err.jump)) {
        PyErr_Format(PyExc_ImportError, "%s is not the libjpeg API %d this extension was built for: %s", path,
                     JPEG_LIB_VERSION, msg);
        memset(&lj, 0, sizeof lj);
        dlclose(lib);
        return NULL;
    }
    jpeg_create_decompress(&c);
    jpeg_destroy_decompress(&c);
    lj.lib = lib;
    return PyLong_FromLong(JPEG_LIB_VERSION);
}

/* 1 when load_libjpeg() has opened a library, else 0 with a RuntimeError set. */
static int lj_loaded(void)
{
    if (lj.lib != NULL)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "wsitool._jpegloop.load_libjpeg() was not called");
    return 0;
}

/* Decode the pending tiles one after another and check each; releases them all.
 *
 * Thread safety: each thread has its own Decoder (buffers, mutex); the libjpeg
 * state is made per tile.  The nvImageCodec instance (header parsing) is only
 * read: its codec registry does not change after creation, and every code
 * stream gets a parser of its own (nvImageCodec src/codec_registry.cpp,
 * CodecRegistry::getParser; src/code_stream.cpp). */
static void flush(Decoder* self, const Plan* p, Pending* q, int n, Tally* t)
{
    char msg[JMSG_LENGTH_MAX];
    for (int i = 0; i < n; i++) {
        Pending* e = &q[i];
        release(e);
        if (!lj_decode(e->data, e->len, 0, e->sx0, e->sy0, e->sx1, e->sy1, e->target, e->stride, &self->row,
                       &self->row_cap, &t->allocations, msg)) {
            fail_decode(t, p, e, msg);
            continue;
        }
        if (e->rgb != NULL) {
            widen(p, e->rgb, e->dy0, e->dy1, e->dx0, e->dx1);
            t->scratch++;
        } else if (e->how == 0) {
            t->direct++;
        } else {
            t->roi++;
        }
        t->decoded++;
    }
}

/* Pieces of the output copied elsewhere as soon as their tiles are decoded (while
 * they are still in the cache): each piece is 6 int64, (dest byte offset, dest row
 * stride in bytes, y0, y1, x0, x1), the rectangle [y0, y1) x [x0, x1) of the output
 * whose pixel (y0, x0) goes to dest + offset (checked by check_pieces). */
typedef struct Scatter {
    unsigned char* dest;
    const int64_t* pieces; /* the caller's pieces as they were at the call (owned: see check_pieces) */
    int64_t* owned;
    Py_ssize_t n;
    const struct Scatter* next; /* more pieces, into another dest (or NULL) */
    /* 0: the RGB tiles of run_intervals are decoded one at a time into a tile-sized
     * scratch (which stays in the cache), their pieces copied from it and the output
     * left unwritten (its pixels are not wanted); 1: the output holds them too */
    int keep;
} Scatter;

/* Copy the parts of every piece inside the output rectangle [y0, y1) x [x0, x1) from
 * src, whose first byte is the output's pixel (oy, ox), rows stride bytes apart. */
static void scatter_from(const Scatter* sc, const unsigned char* src, size_t stride, int64_t oy, int64_t ox,
                         int64_t channels, int64_t y0, int64_t y1, int64_t x0, int64_t x1)
{
    for (Py_ssize_t i = 0; i < sc->n; i++) {
        const int64_t* pc = sc->pieces + 6 * i;
        int64_t iy0 = pc[2] > y0 ? pc[2] : y0, iy1 = pc[3] < y1 ? pc[3] : y1;
        int64_t ix0 = pc[4] > x0 ? pc[4] : x0, ix1 = pc[5] < x1 ? pc[5] : x1;
        if (iy0 >= iy1 || ix0 >= ix1)
            continue;
        size_t n = (size_t)((ix1 - ix0) * channels);
        unsigned char* d = sc->dest + pc[0] + (iy0 - pc[2]) * pc[1] + (ix0 - pc[4]) * channels;
        const unsigned char* s = src + (size_t)(iy0 - oy) * stride + (size_t)((ix0 - ox) * channels);
        for (int64_t y = iy0; y < iy1; y++, d += pc[1], s += stride)
            memcpy(d, s, n);
    }
    if (sc->next != NULL)
        scatter_from(sc->next, src, stride, oy, ox, channels, y0, y1, x0, x1);
}

/* Copy the parts of every piece inside the output rectangle [y0, y1) x [x0, x1). */
static void scatter_rect(const Scatter* sc, const unsigned char* out, int64_t out_w, int64_t channels,
                         int64_t y0, int64_t y1, int64_t x0, int64_t x1)
{
    scatter_from(sc, out, (size_t)(out_w * channels), 0, 0, channels, y0, y1, x0, x1);
}

/* Scatter the output of jobs [k0, k1) (row by row of the region's tile grid). */
static void scatter_jobs(const Scatter* sc, const Plan* p, Py_ssize_t k0, Py_ssize_t k1)
{
    while (k0 < k1) {
        int64_t row = k0 / p->ncols, first = k0 % p->ncols;
        int64_t last = (k1 - 1) / p->ncols == row ? (k1 - 1) % p->ncols : p->ncols - 1;
        int64_t ty0 = (p->r0 + row) * p->tile_h, tx0 = (p->c0 + first) * p->tile_w;
        int64_t tx1 = (p->c0 + last + 1) * p->tile_w, ty1 = ty0 + p->tile_h;
        int64_t y0 = ty0 > p->cy0 ? ty0 : p->cy0, y1 = ty1 < p->cy1 ? ty1 : p->cy1;
        int64_t x0 = tx0 > p->cx0 ? tx0 : p->cx0, x1 = tx1 < p->cx1 ? tx1 : p->cx1;
        scatter_rect(sc, p->out, p->out_w, p->channels, y0 - p->ry, y1 - p->ry, x0 - p->rx, x1 - p->rx);
        k0 += last - first + 1;
    }
}

/* Where a w x h decode goes: straight into the output at (dy0, dx0) when it is RGB, else
 * into the RGB scratch of batch slot `slot` (widened to RGBA after the decode); *row_stride
 * set; NULL when that scratch cannot be had. */
static unsigned char* decode_target(Decoder* self, const Plan* p, int slot, int64_t dy0, int64_t dx0, int64_t w,
                                    int64_t h, size_t* row_stride, Tally* t)
{
    if (p->channels == 3) {
        *row_stride = (size_t)(p->out_w * 3);
        return p->out + (size_t)dy0 * *row_stride + (size_t)dx0 * 3;
    }
    if (!reserve(&self->rgb_buf[slot], &self->rgb_cap[slot], (size_t)(w * h * 3), &t->allocations))
        return NULL;
    *row_stride = (size_t)w * 3;
    return self->rgb_buf[slot];
}

/* The tile scratch of the scattering path (run_intervals): w x h RGB, rows packed; NULL
 * when it cannot be had.  Shares batch slot 0's RGB buffer, which only RGBA outputs use. */
static unsigned char* scratch_target(Decoder* self, int64_t w, int64_t h, size_t* row_stride, Tally* t)
{
    if (!reserve(&self->rgb_buf[0], &self->rgb_cap[0], (size_t)(w * h * 3), &t->allocations))
        return NULL;
    *row_stride = (size_t)w * 3;
    return self->rgb_buf[0];
}

/* A tile decoded into the scratch (its pixel (0, 0) the output's (dy0, dx0)): its parts of
 * the pieces copied, and with sc->keep its rectangle of the output. */
static void place_scratch(const Scatter* sc, const Plan* p, const unsigned char* scratch, size_t stride,
                          int64_t dy0, int64_t dy1, int64_t dx0, int64_t dx1)
{
    scatter_from(sc, scratch, stride, dy0, dx0, 3, dy0, dy1, dx0, dx1);
    if (!sc->keep)
        return;
    size_t row_bytes = (size_t)(p->out_w * 3), n = (size_t)(dx1 - dx0) * 3;
    for (int64_t y = dy0; y < dy1; y++)
        memcpy(p->out + (size_t)y * row_bytes + (size_t)dx0 * 3, scratch + (size_t)(y - dy0) * stride, n);
}

/* The per-interval (per-tile) path: each job its own code stream. */
static void run_intervals(Decoder* self, const Plan* p, Py_ssize_t j0, Py_ssize_t j1, int batch, Tally* t,
                          const Scatter* sc)
{
    Py_ssize_t scattered = j0; /* jobs before this one are decoded and scattered */
    Pending q[MAX_BATCH];
    int n = 0;
    /* pieces of RGB tiles: each tile decoded into the scratch, which is still in the cache
     * when its pieces (and with keep, the output) are copied from it */
    int via_scratch = sc != NULL && p->channels == 3;
    if (via_scratch)
        batch = 1;
    /* the tile's SOI lands under the prefix's end; a scan segment has none */
    size_t start = p->scan_segments ? p->prefix_len : p->prefix_len ? p->prefix_len - 2 : 0;
    /* first pass: the bytes this call reads, so that one buffer holds them all (the
     * code streams point into it until the batch is decoded: it must not move) */
    size_t need = 0;
    for (Py_ssize_t k = j0; k < j1; k++) {
        int64_t row = p->r0 + k / p->ncols, col = p->c0 + k % p->ncols, index;
        if (__builtin_mul_overflow(row, p->across, &index) || __builtin_add_overflow(index, col, &index)
            || index < 0 || index >= p->n_segments)
            continue;
        int64_t offset = p->offsets[index], count = p->counts[index];
        if (offset <= 0 || count <= 0 || count > p->file_size || offset > p->file_size - count)
            continue;
        if (__builtin_add_overflow(need, start + (size_t)count, &need))
            need = SIZE_MAX;
    }
    int no_memory = need > 0 && (need == SIZE_MAX
                                 || !reserve(&self->arena, &self->arena_cap, need, &t->allocations));
    size_t used = 0;
    for (Py_ssize_t k = j0; k < j1; k++) {
        if (via_scratch && scattered < k) { /* missing or failed before its decode: zeros in out */
            scatter_jobs(sc, p, scattered, k);
            scattered = k;
        }
        int64_t row = p->r0 + k / p->ncols, col = p->c0 + k % p->ncols;
        int64_t tx0 = col * p->tile_w, ty0 = row * p->tile_h;
        int64_t ox0 = tx0 > p->cx0 ? tx0 : p->cx0, ox1 = tx0 + p->tile_w < p->cx1 ? tx0 + p->tile_w : p->cx1;
        int64_t oy0 = ty0 > p->cy0 ? ty0 : p->cy0, oy1 = ty0 + p->tile_h < p->cy1 ? ty0 + p->tile_h : p->cy1;
        int64_t sx0 = ox0 - tx0, sy0 = oy0 - ty0, sx1 = ox1 - tx0, sy1 = oy1 - ty0;
        int64_t dy0 = oy0 - p->ry, dy1 = oy1 - p->ry, dx0 = ox0 - p->rx, dx1 = ox1 - p->rx;
        int64_t index;
        if (__builtin_mul_overflow(row, p->across, &index) || __builtin_add_overflow(index, col, &index))
            index = -1; /* reported as F_NO_SEGMENT */
        if (index < 0 || index >= p->n_segments) {
            fail(t, p, k, F_NO_SEGMENT, index, p->n_segments, dy0, dy1, dx0, dx1);
            continue;
        }
        int64_t offset = p->offsets[index], count = p->counts[index];
        if (offset == 0 || count == 0) {
            zero_rect(p, dy0, dy1, dx0, dx1);
            t->missing++;
            continue;
        }
        if (offset < 0 || count < 0 || count > p->file_size || offset > p->file_size - count) {
            fail(t, p, k, F_PAST_EOF, offset, count, dy0, dy1, dx0, dx1);
            continue;
        }
        Pending* e = &q[n];
        memset(e, 0, sizeof *e);
        e->job = k;
        e->dy0 = dy0;
        e->dy1 = dy1;
        e->dx0 = dx0;
        e->dx1 = dx1;
        /* (a count grown since the first pass, by an out or dest over the counts: no room) */
        if (no_memory || need - used < start + (size_t)count) {
            fail(t, p, k, F_NO_MEMORY, 0, 0, dy0, dy1, dx0, dx1);
            continue;
        }
        unsigned char* buf = self->arena + used;
        used += start + (size_t)count;
        ssize_t got = read_at(p, buf + start, (size_t)count, offset);
        if (got < 0) {
            fail(t, p, k, F_IO_ERROR, errno, 0, dy0, dy1, dx0, dx1);
            continue;
        }
        if (got != count) {
            fail(t, p, k, F_SHORT_READ, (long long)got, count, dy0, dy1, dx0, dx1);
            continue;
        }
        t->bytes_read += count;
        if (p->scan_segments) {
            /* the interval's closing RSTn (T.81 B.2.4.4) ends this stream: EOI */
            unsigned char* end = buf + start + (size_t)count;
            if (count >= 2 && end[-2] == 0xFF && end[-1] >= 0xD0 && end[-1] <= 0xD7)
                end[-1] = 0xD9;
        } else if (count < 2 || buf[start] != 0xFF || buf[start + 1] != 0xD8) {
            long long first = count >= 2 ? ((long long)buf[start] << 8) | buf[start + 1] : (count ? buf[start] : 0);
            fail(t, p, k, F_NOT_SOI, first, count < 2 ? count : 2, dy0, dy1, dx0, dx1);
            continue;
        }
        if (p->prefix_len)
            memcpy(buf, p->prefix, p->prefix_len);
        nvimgcodecStatus_t st = api.stream_from_mem(api.instance, &e->stream, buf, start + (size_t)count, NULL);
        nvimgcodecImageInfo_t info;
        if (st == NVIMGCODEC_STATUS_SUCCESS && e->stream != NULL) {
            memset(&info, 0, sizeof info);
            info.struct_type = NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO;
            info.struct_size = sizeof info;
            st = api.stream_image_info(e->stream, &info);
        } else if (st == NVIMGCODEC_STATUS_SUCCESS) {
            st = NVIMGCODEC_STATUS_BAD_CODESTREAM;
        }
        if (st != NVIMGCODEC_STATUS_SUCCESS) {
            release(e);
            fail(t, p, k, F_HEADER, (long long)st, 0, dy0, dy1, dx0, dx1);
            continue;
        }
        int64_t width = info.plane_info[0].width, height = info.plane_info[0].height;
        if (width != p->tile_w || height != p->tile_h) {
            int64_t inner_w = p->level_w - col * p->tile_w, inner_h = p->level_h - row * p->tile_h;
            if (inner_w > p->tile_w)
                inner_w = p->tile_w;
            if (inner_h > p->tile_h)
                inner_h = p->tile_h;
            if ((width != p->tile_w && width != inner_w) || (height != p->tile_h && height != inner_h)) {
                release(e);
                fail(t, p, k, F_GRID, width, height, dy0, dy1, dx0, dx1);
                continue;
            }
        }
        if (!(0 <= sx0 && sx0 < sx1 && sx1 <= width && 0 <= sy0 && sy0 < sy1 && sy1 <= height)) {
            release(e);
            fail(t, p, k, F_OUTSIDE, width, height, dy0, dy1, dx0, dx1);
            continue;
        }
        release(e); /* the header is checked: libjpeg-turbo decodes from the bytes */
        e->how = sx0 == 0 && sy0 == 0 && sx1 == width && sy1 == height ? 0 : 1;
        int64_t w = sx1 - sx0, h = sy1 - sy0;
        size_t row_stride;
        unsigned char* target = via_scratch ? scratch_target(self, w, h, &row_stride, t)
                                            : decode_target(self, p, n, dy0, dx0, w, h, &row_stride, t);
        if (target == NULL) {
            fail(t, p, k, F_NO_MEMORY, 0, 0, dy0, dy1, dx0, dx1);
            continue;
        }
        if (p->channels != 3)
            e->rgb = target;
        e->data = buf;
        e->len = start + (size_t)count;
        e->sx0 = sx0;
        e->sy0 = sy0;
        e->sx1 = sx1;
        e->sy1 = sy1;
        e->target = target;
        e->stride = row_stride;
        if (via_scratch) {
            Py_ssize_t before = t->n_failures;
            flush(self, p, q, 1, t);
            n = 0;
            if (t->n_failures == before && !t->oom)
                place_scratch(sc, p, target, row_stride, dy0, dy1, dx0, dx1);
            else
                scatter_jobs(sc, p, k, k + 1); /* the zeros fail() wrote */
            scattered = k + 1;
        } else if (++n == batch) {
            flush(self, p, q, n, t);
            n = 0;
            if (sc != NULL) {
                scatter_jobs(sc, p, scattered, k + 1);
                scattered = k + 1;
            }
        }
    }
    flush(self, p, q, n, t);
    if (sc != NULL)
        scatter_jobs(sc, p, scattered, j1);
}

/* ------------------------------------------------------------------------
 * NDPI: the touched restart intervals of a band decoded as ONE code stream.
 *
 * A band is a rectangle of a region's intervals: the rest of one row of the
 * region's tile grid, or whole rows of it.  Its stream: the level's header with
 * the SOF's height and width set to the band's, then each interval's bytes as
 * stored, row after row, each closing RSTn renumbered to the next of this
 * stream (RST0, RST1, ... mod 8), the last one's made EOI.  A restart resets the
 * DC predictions (T.81 F.2.2.5), and with the DRI unchanged each MCU row of the
 * band holds exactly its intervals: one decode gives the pixels the per-interval
 * decodes give, with one header parse instead of one per interval.  Only where
 * no component is subsampled (every one 1x1 in the SOF: libjpeg's upsampling
 * would otherwise reach across an interval's edge, which the per-interval
 * decode, and OpenSlide, replicate) and the intervals are one MCU row (8 pixels)
 * high and exactly DRI MCUs wide.  Any other band, and any band whose reading,
 * checks or decode fail, takes the per-interval path, which gives the errors.
 */

/* The offset of the SOF's height field in the level's header (its width follows)
 * when this level's intervals can be spliced (see above); else 0. */
static size_t splice_sof(const Plan* p)
{
    const unsigned char* h = p->prefix;
    size_t n = p->prefix_len, i = 2, sof = 0;
    long dri = 0;
    int sos = 0;
    if (!p->scan_segments || n < 4 || h[0] != 0xFF || h[1] != 0xD8)
        return 0;
    while (!sos && i + 4 <= n) {
        unsigned m = h[i + 1];
        if (h[i] != 0xFF)
            return 0;
        if (m == 0xFF) { /* fill byte */
            i++;
            continue;
        }
        size_t len = ((size_t)h[i + 2] << 8) | h[i + 3];
        if (len < 2 || i + 2 + len > n)
            return 0;
        const unsigned char* s = h + i + 4; /* the segment's body: len - 2 bytes */
        if (m == 0xC0 || m == 0xC1) {       /* sequential DCT, Huffman */
            unsigned nc = len >= 8 ? s[5] : 0;
            if (sof != 0 || s[0] != 8 || (nc != 1 && nc != 3) || len != 8 + 3 * (size_t)nc)
                return 0;
            for (unsigned c = 0; c < nc; c++)
                if (s[6 + 3 * c + 1] != 0x11) /* sampling factors 1x1 */
                    return 0;
            sof = i + 5;
        } else if (m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            return 0; /* progressive, lossless, hierarchical or arithmetic */
        } else if (m == 0xDD) {
            if (len != 4)
                return 0;
            dri = ((long)s[0] << 8) | s[1];
        } else if (m == 0xDA) {
            sos = 1;
        }
        i += 2 + len;
    }
    if (!sos || sof == 0 || dri <= 0 || p->tile_h != 8 || p->tile_w != 8 * (int64_t)dri)
        return 0;
    int64_t height = ((int64_t)h[sof] << 8) | h[sof + 1], width = ((int64_t)h[sof + 2] << 8) | h[sof + 3];
    return height == p->tile_h && width == p->tile_w ? sof : 0;
}

/* 1 when the n bytes at d hold a marker: an 0xFF byte not followed by a stuffed 0x00
 * (a fill byte before the closing marker counts too).  Entropy-coded data has none; a
 * corrupt interval with one is not spliced, so that whatever the decoder does at a
 * marker out of place stays inside that interval's own code stream. */
static int holds_marker(const unsigned char* d, size_t n)
{
    const unsigned char* end = d + n;
    for (const unsigned char* q = d; (q = memchr(q, 0xFF, (size_t)(end - q))) != NULL; q += 2)
        if (q + 1 >= end || q[1] != 0x00)
            return 1;
    return 0;
}

/* Read jobs [k0, k1) (a band: the rest of one row, or whole rows) into the arena as one
 * spliced code stream (see above); its length, or 0 when the band cannot be spliced. */
static size_t splice_read(Decoder* self, const Plan* p, size_t sof, Py_ssize_t k0, Py_ssize_t k1, int64_t bw,
                          int64_t bh, Tally* t)
{
    size_t total = p->prefix_len;
    for (Py_ssize_t k = k0; k < k1; k++) {
        int64_t row = p->r0 + k / p->ncols, col = p->c0 + k % p->ncols, index;
        if (__builtin_mul_overflow(row, p->across, &index) || __builtin_add_overflow(index, col, &index)
            || index < 0 || index >= p->n_segments)
            return 0;
        int64_t offset = p->offsets[index], count = p->counts[index];
        if (offset <= 0 || count < 2 || count > p->file_size || offset > p->file_size - count
            || __builtin_add_overflow(total, (size_t)count, &total))
            return 0;
    }
    if (!reserve(&self->arena, &self->arena_cap, total, &t->allocations))
        return 0;
    unsigned char* buf = self->arena;
    memcpy(buf, p->prefix, p->prefix_len);
    buf[sof] = (unsigned char)(bh >> 8);
    buf[sof + 1] = (unsigned char)(bh & 0xFF);
    buf[sof + 2] = (unsigned char)(bw >> 8);
    buf[sof + 3] = (unsigned char)(bw & 0xFF);
    size_t at = p->prefix_len;
    for (Py_ssize_t k = k0; k < k1; k++) {
        int64_t index = (p->r0 + k / p->ncols) * p->across + p->c0 + k % p->ncols;
        int64_t offset = p->offsets[index], count = p->counts[index];
        if (read_at(p, buf + at, (size_t)count, offset) != (ssize_t)count)
            return 0;
        at += (size_t)count;
        /* its closing marker: an RSTn, or EOI for the level's last interval (the band's last) */
        unsigned char m = buf[at - 1];
        if (buf[at - 2] != 0xFF || m < 0xD0 || m > 0xD9 || m == 0xD8 || (m == 0xD9 && k + 1 < k1)
            || holds_marker(buf + at - count, (size_t)count - 2))
            return 0;
        buf[at - 1] = k + 1 == k1 ? 0xD9 : (unsigned char)(0xD0 + (k - k0) % 8);
    }
    return at;
}

/* Decode jobs [k0, k1), a band (see splice_read), as one code stream into the output;
 * 1 when done (pixels written and counted as the per-interval path counts them, and in
 * `spliced`), 0 when the per-interval path must decode them (nothing counted). */
static int splice_band(Decoder* self, const Plan* p, size_t sof, Py_ssize_t k0, Py_ssize_t k1, Tally* t)
{
    int64_t first = k0 % p->ncols, n = k1 - k0;
    int64_t nc = n <= p->ncols - first ? n : p->ncols, nr = n / nc;
    int64_t bx0 = (p->c0 + first) * p->tile_w, by0 = (p->r0 + k0 / p->ncols) * p->tile_h;
    int64_t bw = nc * p->tile_w, bh = nr * p->tile_h;
    if (nr * nc != n || (first != 0 && nc != n) || bw > 65535 || bh > 65535 || bx0 + bw > p->level_w)
        return 0;
    size_t len = splice_read(self, p, sof, k0, k1, bw, bh, t);
    if (len == 0)
        return 0;
    int64_t ox0 = bx0 > p->cx0 ? bx0 : p->cx0, ox1 = bx0 + bw < p->cx1 ? bx0 + bw : p->cx1;
    int64_t oy0 = by0 > p->cy0 ? by0 : p->cy0, oy1 = by0 + bh < p->cy1 ? by0 + bh : p->cy1;
    int64_t w = ox1 - ox0, h = oy1 - oy0, dy0 = oy0 - p->ry, dx0 = ox0 - p->rx;
    if (w <= 0 || h <= 0)
        return 0;
    size_t row_stride;
    unsigned char* target = decode_target(self, p, 0, dy0, dx0, w, h, &row_stride, t);
    char msg[JMSG_LENGTH_MAX];
    if (target == NULL
        || !lj_decode(self->arena, len, 0, ox0 - bx0, oy0 - by0, ox1 - bx0, oy1 - by0, target, row_stride,
                      &self->row, &self->row_cap, &t->allocations, msg))
        return 0;
    if (p->channels == 4)
        widen(p, self->rgb_buf[0], dy0, dy0 + h, dx0, dx0 + w);
    for (Py_ssize_t k = k0; k < k1; k++) { /* each interval as the per-interval path counts it */
        int64_t tx0 = (p->c0 + k % p->ncols) * p->tile_w, ty0 = (p->r0 + k / p->ncols) * p->tile_h;
        int whole = tx0 >= p->cx0 && tx0 + p->tile_w <= p->cx1 && ty0 >= p->cy0 && ty0 + p->tile_h <= p->cy1;
        if (p->channels == 4)
            t->scratch++;
        else if (whole)
            t->direct++;
        else
            t->roi++;
    }
    t->decoded += n;
    t->spliced += n;
    t->bytes_read += (long long)(len - p->prefix_len);
    return 1;
}

/* Jobs [j0, j1): where the level allows (splice_sof), in bands (the rest of a row begun
 * part-way, then whole rows, then a row's beginning) each decoded as one code stream,
 * a band that cannot be through the per-interval path; else all per interval. */
static void run_jobs(Decoder* self, const Plan* p, Py_ssize_t j0, Py_ssize_t j1, int batch, Tally* t,
                     const Scatter* sc)
{
    size_t sof = splice_sof(p);
    if (sof == 0) {
        run_intervals(self, p, j0, j1, batch, t, sc);
        return;
    }
    Py_ssize_t most_rows = 65535 / p->tile_h; /* the SOF's height field */
    for (Py_ssize_t k = j0; k < j1;) {
        Py_ssize_t row_end = (k / p->ncols + 1) * p->ncols, end;
        if (k % p->ncols != 0 || j1 < row_end) {
            end = j1 < row_end ? j1 : row_end;
        } else {
            Py_ssize_t rows = (j1 - k) / p->ncols;
            end = k + (rows < most_rows ? rows : most_rows) * p->ncols;
        }
        if (!splice_band(self, p, sof, k, end, t))
            run_intervals(self, p, k, end, batch, t, NULL);
        if (sc != NULL)
            scatter_jobs(sc, p, k, end);
        k = end;
    }
}

/* Check pieces (a buffer of int64, 6 a piece; see Scatter) against an (out_h, out_w,
 * channels) source and a dest of dest_len bytes; fill *sc with a private copy of them
 * (sc->owned, freed by free_pieces): the copies never re-read the caller's buffer, which
 * dest may overlap and other threads may change while the GIL is released.  0 with
 * TypeError if the buffer is not of int64 (got with PyBUF_FORMAT), ValueError if any
 * piece reads outside the source or writes outside dest, MemoryError. */
static int check_pieces(const Py_buffer* pieces, unsigned char* dest, Py_ssize_t dest_len, int64_t out_h,
                        int64_t out_w, int64_t channels, Scatter* sc)
{
    const char* fmt = pieces->format != NULL ? pieces->format : "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    if (pieces->itemsize != 8 || (strcmp(fmt, "q") != 0 && strcmp(fmt, "l") != 0)) {
        PyErr_SetString(PyExc_TypeError, "pieces must be an int64 array");
        return 0;
    }
    if (pieces->len % 48 != 0) {
        PyErr_SetString(PyExc_ValueError, "pieces must be an array of 6 int64 per piece");
        return 0;
    }
    sc->dest = dest;
    sc->next = NULL;
    sc->n = pieces->len / 48;
    sc->owned = sc->n ? (int64_t*)malloc((size_t)pieces->len) : NULL;
    if (sc->n && sc->owned == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    if (sc->n)
        memcpy(sc->owned, pieces->buf, (size_t)pieces->len);
    sc->pieces = sc->owned;
    for (Py_ssize_t i = 0; i < sc->n; i++) {
        const int64_t* pc = sc->pieces + 6 * i;
        int64_t off = pc[0], stride = pc[1], y0 = pc[2], y1 = pc[3], x0 = pc[4], x1 = pc[5], span, end;
        int ok = 0 <= y0 && y0 < y1 && y1 <= out_h && 0 <= x0 && x0 < x1 && x1 <= out_w && off >= 0
                 && stride >= (x1 - x0) * channels && stride <= (int64_t)dest_len
                 && !__builtin_mul_overflow(y1 - y0 - 1, stride, &span)
                 && !__builtin_add_overflow(span, (x1 - x0) * channels, &span)
                 && !__builtin_add_overflow(off, span, &end) && end <= (int64_t)dest_len;
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "piece %zd reads outside the source or writes outside dest", i);
            free(sc->owned);
            sc->owned = NULL;
            return 0;
        }
    }
    return 1;
}

static void free_pieces(Scatter* sc)
{
    free(sc->owned);
    sc->owned = NULL;
}

static PyObject* jl_scatter(PyObject* self, PyObject* args)
{
    Py_buffer src, dest, pieces;
    PyObject *src_obj, *pieces_obj;
    if (!PyArg_ParseTuple(args, "Ow*O", &src_obj, &dest, &pieces_obj))
        return NULL;
    if (PyObject_GetBuffer(pieces_obj, &pieces, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&dest);
        return NULL;
    }
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&dest);
        PyBuffer_Release(&pieces);
        return NULL;
    }
    PyObject* result = NULL;
    Scatter sc = {0};
    if (src.ndim != 3 || src.itemsize != 1 || src.format == NULL || strcmp(src.format, "B") != 0) {
        PyErr_SetString(PyExc_ValueError, "src must be a C-contiguous (h, w, c) uint8 buffer");
        goto done;
    }
    if (!check_pieces(&pieces, (unsigned char*)dest.buf, dest.len, src.shape[0], src.shape[1], src.shape[2], &sc))
        goto done;
    Py_BEGIN_ALLOW_THREADS
    scatter_rect(&sc, (const unsigned char*)src.buf, src.shape[1], src.shape[2], 0, src.shape[0], 0, src.shape[1]);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    free_pieces(&sc);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dest);
    PyBuffer_Release(&pieces);
    return result;
}

static int get_i64(PyObject* seq, Py_ssize_t i, int64_t* v)
{
    PyObject* o = PyTuple_GetItem(seq, i);
    if (o == NULL)
        return 0;
    long long x = PyLong_AsLongLong(o);
    if (x == -1 && PyErr_Occurred())
        return 0;
    *v = (int64_t)x;
    return 1;
}

/* The fetched byte ranges a call reads tiles from (fd -1): their buffers are held
 * (PyObject_GetBuffer) for the call, so the GIL can be released while they are read. */
typedef struct {
    Py_ssize_t n;
    int64_t* start;
    int64_t* len;
    unsigned char** ptr;
    Py_buffer* views;
} Extents;

static void release_extents(Extents* ex)
{
    for (Py_ssize_t i = 0; i < ex->n; i++)
        PyBuffer_Release(&ex->views[i]);
    free(ex->start);
    free(ex->len);
    free(ex->ptr);
    free(ex->views);
    memset(ex, 0, sizeof *ex);
}

/* Take a sequence of (start, bytes-like), ascending by start, into ex; 0 with an error set. */
static int take_extents(PyObject* obj, Extents* ex)
{
    /* a tuple of its own (a list could be changed by code that __index__ or a buffer runs) */
    PyObject* seq = PySequence_Tuple(obj);
    if (seq == NULL)
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    size_t m = n > 0 ? (size_t)n : 1;
    ex->start = malloc(m * sizeof *ex->start);
    ex->len = malloc(m * sizeof *ex->len);
    ex->ptr = malloc(m * sizeof *ex->ptr);
    ex->views = calloc(m, sizeof *ex->views);
    if (!ex->start || !ex->len || !ex->ptr || !ex->views) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* item = PyTuple_GET_ITEM(seq, i); /* (held by seq; a tuple of two is immutable) */
        int64_t start;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !get_i64(item, 0, &start) || start < 0
            || (i > 0 && start < ex->start[i - 1])) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "extents must be (start >= 0, bytes) in ascending start");
            Py_DECREF(seq);
            return 0;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 1), &ex->views[i], PyBUF_SIMPLE) < 0) {
            Py_DECREF(seq);
            return 0;
        }
        ex->n = i + 1; /* (released from here on) */
        ex->start[i] = start;
        ex->len[i] = (int64_t)ex->views[i].len;
        ex->ptr[i] = (unsigned char*)ex->views[i].buf;
    }
    ex->n = n;
    Py_DECREF(seq);
    return 1;
}

static const char decode_tiles_doc[] =
    "decode_tiles(fd, prefix, out, offsets, counts, level, region, j0, j1, batch, scan_segments=0,\n"
    "             dest=None, pieces=None, keep=True, dest2=None, pieces2=None, extents=None)\n"
    "--\n\n"
    "Decode jobs [j0, j1) of a region's tiles into ``out`` (see wsitool/codec/jpegloop.py).\n\n"
    "fd: the slide's file descriptor; prefix: bytes put in front of each tile\n"
    "(JPEG prefix, or b''); out: writable C-contiguous (h, w, 3 or 4) uint8 buffer;\n"
    "offsets, counts: the level's segment offsets and byte counts, int64;\n"
    "level: (tile_w, tile_h, level_w, level_h, tiles_across, file_size);\n"
    "region: (rx, ry, cx0, cy0, cx1, cy1) in level pixels (region origin and\n"
    "its part inside the level); batch: tiles read before they are decoded (1..64);\n"
    "scan_segments: 1 when the tiles are NDPI restart intervals (no SOI: the\n"
    "prefix is a whole header put in front, a final RSTn becomes EOI);\n"
    "dest, pieces: optional; after each decode call the decoded tiles' parts of\n"
    "each piece are copied into dest (see scatter()), while still in the cache;\n"
    "keep: with pieces, 0 when out's pixels are not wanted (RGB tiles are then\n"
    "decoded one by one into a scratch the pieces are copied from; out holds only\n"
    "failed and missing tiles' zeros), 1 (the default) when they are;\n"
    "dest2, pieces2: optional, with pieces: more pieces, into dest2;\n"
    "extents: with fd -1, the tiles' bytes: a sequence of (start, bytes-like) in\n"
    "ascending start, each holding the file's bytes from start on (a tile found in\n"
    "none fails as an I/O error, ENODATA).\n\n"
    "Returns (direct, roi, scratch, missing, bytes_read, decoded, allocations, spliced,\n"
    "failures): tile counts, bytes read, buffers (re)allocated, the intervals decoded\n"
    "in spliced bands (scan_segments: see splice_band), and failures a list of\n"
    "(job, code, a, b, message), message libjpeg-turbo's for F_DECODE.  Raises MemoryError if the failure list itself cannot be\n"
    "allocated; never raises for a bad tile.";

static PyObject* Decoder_decode_tiles(Decoder* self, PyObject* args)
{
    int fd, batch, scan_segments = 0, keep = 1;
    Py_buffer prefix, out, offsets, counts;
    Py_buffer dest = {0}, pieces = {0}, dest2 = {0}, pieces2 = {0};
    PyObject *out_obj, *level, *region, *dest_obj = Py_None, *pieces_obj = Py_None;
    PyObject *dest2_obj = Py_None, *pieces2_obj = Py_None, *extents_obj = Py_None;
    Py_ssize_t j0, j1;
    if (!PyArg_ParseTuple(args, "iy*Oy*y*O!O!nni|iOOpOOO", &fd, &prefix, &out_obj, &offsets, &counts,
                          &PyTuple_Type, &level, &PyTuple_Type, &region, &j0, &j1, &batch, &scan_segments,
                          &dest_obj, &pieces_obj, &keep, &dest2_obj, &pieces2_obj, &extents_obj))
        return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&prefix);
        PyBuffer_Release(&offsets);
        PyBuffer_Release(&counts);
        return NULL;
    }
    PyObject* result = NULL;
    Scatter sc = {0}, sc2 = {0}, *scp = NULL;
    Extents ex = {0};
    Tally t;
    memset(&t, 0, sizeof t);
    if (extents_obj != Py_None && !take_extents(extents_obj, &ex))
        goto done;
    if ((fd < 0) != (extents_obj != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "extents go with fd -1, and fd -1 needs extents");
        goto done;
    }
    if (dest_obj != Py_None || pieces_obj != Py_None) {
        if (PyObject_GetBuffer(dest_obj, &dest, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (PyObject_GetBuffer(pieces_obj, &pieces, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
    }
    if (dest2_obj != Py_None || pieces2_obj != Py_None) {
        if (pieces.obj == NULL) {
            PyErr_SetString(PyExc_ValueError, "dest2 and pieces2 need dest and pieces");
            goto done;
        }
        if (PyObject_GetBuffer(dest2_obj, &dest2, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        if (PyObject_GetBuffer(pieces2_obj, &pieces2, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
    }
    Plan p;
    memset(&p, 0, sizeof p);
    if (!self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "decoder not initialised");
        goto done;
    }
    if (PyTuple_GET_SIZE(level) != 6 || PyTuple_GET_SIZE(region) != 6) {
        PyErr_SetString(PyExc_ValueError, "level and region must be 6-tuples");
        goto done;
    }
    int64_t v[6];
    for (int i = 0; i < 6; i++)
        if (!get_i64(level, i, &v[i]))
            goto done;
    p.tile_w = v[0], p.tile_h = v[1], p.level_w = v[2], p.level_h = v[3], p.across = v[4], p.file_size = v[5];
    for (int i = 0; i < 6; i++)
        if (!get_i64(region, i, &v[i]))
            goto done;
    p.rx = v[0], p.ry = v[1], p.cx0 = v[2], p.cy0 = v[3], p.cx1 = v[4], p.cy1 = v[5];
    if (out.ndim != 3 || out.itemsize != 1 || out.format == NULL || strcmp(out.format, "B") != 0
        || (out.shape[2] != 3 && out.shape[2] != 4)) {
        PyErr_SetString(PyExc_ValueError, "out must be a C-contiguous (h, w, 3 or 4) uint8 buffer");
        goto done;
    }
    p.out = (unsigned char*)out.buf;
    p.out_h = out.shape[0];
    p.out_w = out.shape[1];
    p.channels = out.shape[2];
    if (offsets.len % 8 != 0 || counts.len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "offsets and counts must be arrays of 8-byte integers");
        goto done;
    }
    p.offsets = (const int64_t*)offsets.buf;
    p.counts = (const int64_t*)counts.buf;
    /* A file may list more offsets than byte counts or the reverse (the level
     * checked that both cover its grid): only indices both have are read. */
    p.n_segments = (offsets.len < counts.len ? offsets.len : counts.len) / 8;
    p.fd = fd < 0 ? -1 : fd;
    p.n_ext = ex.n;
    p.ext_start = ex.start;
    p.ext_len = ex.len;
    p.ext_ptr = (const unsigned char* const*)ex.ptr;
    p.prefix = (const unsigned char*)prefix.buf;
    p.prefix_len = (size_t)prefix.len;
    p.scan_segments = scan_segments != 0;
    if (p.tile_w > COORD_MAX || p.tile_h > COORD_MAX || p.level_w > COORD_MAX || p.level_h > COORD_MAX
        || p.across > COORD_MAX || p.rx < -COORD_MAX || p.ry < -COORD_MAX || p.rx > COORD_MAX || p.ry > COORD_MAX) {
        PyErr_SetString(PyExc_ValueError, "level or region size out of range");
        goto done;
    }
    if (p.prefix_len == 1 || p.tile_w < 1 || p.tile_h < 1 || p.across < 1 || batch < 1 || batch > MAX_BATCH
        || p.cx0 >= p.cx1 || p.cy0 >= p.cy1 || p.cx0 < 0 || p.cy0 < 0 || p.cx1 > p.level_w || p.cy1 > p.level_h
        || p.cx0 < p.rx || p.cy0 < p.ry || p.cx1 - p.rx > p.out_w || p.cy1 - p.ry > p.out_h) {
        PyErr_SetString(PyExc_ValueError, "inconsistent level, region, out or batch");
        goto done;
    }
    p.c0 = p.cx0 / p.tile_w;
    p.r0 = p.cy0 / p.tile_h;
    p.ncols = (p.cx1 - 1) / p.tile_w - p.c0 + 1;
    int64_t nrows = (p.cy1 - 1) / p.tile_h - p.r0 + 1;
    if (j0 < 0 || j1 > p.ncols * nrows || j0 > j1) {
        PyErr_SetString(PyExc_ValueError, "job range outside the region's tiles");
        goto done;
    }
    if (pieces.obj != NULL) {
        if (!check_pieces(&pieces, (unsigned char*)dest.buf, dest.len, p.out_h, p.out_w, p.channels, &sc))
            goto done;
        sc.keep = keep;
        if (pieces2.obj != NULL) {
            if (!check_pieces(&pieces2, (unsigned char*)dest2.buf, dest2.len, p.out_h, p.out_w, p.channels, &sc2))
                goto done;
            sc.next = &sc2;
        }
        scp = &sc;
    }
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mutex);
    run_jobs(self, &p, j0, j1, batch, &t, scp);
    if (self->arena_cap > KEEP_BYTES) { /* one-offs (huge tiles): not kept */
        free(self->arena);
        self->arena = NULL;
        self->arena_cap = 0;
    }
    for (int i = 0; i < MAX_BATCH; i++) {
        if (self->rgb_cap[i] > KEEP_BYTES) {
            free(self->rgb_buf[i]);
            self->rgb_buf[i] = NULL;
            self->rgb_cap[i] = 0;
        }
    }
    pthread_mutex_unlock(&self->mutex);
    Py_END_ALLOW_THREADS
    if (t.oom) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject* failures = PyList_New(t.n_failures);
    if (failures == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < t.n_failures; i++) {
        Failure* f = &t.failures[i];
        PyObject* item = Py_BuildValue("(niLLs)", f->job, f->code, f->a, f->b, f->msg);
        if (item == NULL) {
            Py_DECREF(failures);
            goto done;
        }
        PyList_SET_ITEM(failures, i, item);
    }
    result = Py_BuildValue("(LLLLLLLLN)", t.direct, t.roi, t.scratch, t.missing, t.bytes_read, t.decoded,
                           t.allocations, t.spliced, failures);
done:
    free_pieces(&sc);
    free_pieces(&sc2);
    release_extents(&ex);
    free(t.failures);
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&out);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&counts);
    if (dest.obj != NULL)
        PyBuffer_Release(&dest);
    if (pieces.obj != NULL)
        PyBuffer_Release(&pieces);
    if (dest2.obj != NULL)
        PyBuffer_Release(&dest2);
    if (pieces2.obj != NULL)
        PyBuffer_Release(&pieces2);
    return result;
}

static const char decode_jpeg_doc[] =
    "decode_jpeg(stream, out, x0, y0, x1, y1, scale_log2=0) -> None or str\n"
    "--\n\n"
    "Decode the window [x0, x1) x [y0, y1) of the complete JPEG code stream ``stream``\n"
    "at scale 1 / 2**scale_log2 (0 to 3, libjpeg's DCT scaling; the window in pixels of\n"
    "that scale) as RGB into ``out``, a writable (y1 - y0, x1 - x0, 3) uint8 buffer whose rows may\n"
    "be padded (a numpy view of a larger C-contiguous array), the GIL released: the\n"
    "decode of the compiled loop, for the Python path.  Returns None when decoded, else\n"
    "libjpeg-turbo's message (corrupt data included: see lj_decode); the window's pixels\n"
    "are then undefined.  Raises ValueError for an ``out`` of another shape or layout.";

static PyObject* jl_decode_jpeg(PyObject* self, PyObject* args)
{
    Py_buffer stream, out;
    PyObject* out_obj;
    long long x0, y0, x1, y1;
    int scale_log2 = 0;
    if (!lj_loaded() || !PyArg_ParseTuple(args, "y*OLLLL|i", &stream, &out_obj, &x0, &y0, &x1, &y1, &scale_log2))
        return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_RECORDS) < 0) {
        PyBuffer_Release(&stream);
        return NULL;
    }
    PyObject* result = NULL;
    if (out.ndim != 3 || out.itemsize != 1 || out.format == NULL || strcmp(out.format, "B") != 0
        || x0 < 0 || y0 < 0 || x1 <= x0 || y1 <= y0 || x1 > COORD_MAX || y1 > COORD_MAX || scale_log2 < 0
        || scale_log2 > 3
        || out.shape[0] != y1 - y0 || out.shape[1] != x1 - x0 || out.shape[2] != 3 || out.strides[2] != 1
        || out.strides[1] != 3 || out.strides[0] < 3 * out.shape[1]) {
        PyErr_SetString(PyExc_ValueError, "out must be a writable (y1 - y0, x1 - x0, 3) uint8 buffer, "
                                          "pixels packed, rows at least a row apart; scale_log2 0 to 3");
        goto done;
    }
    char msg[JMSG_LENGTH_MAX];
    unsigned char* row = NULL;
    size_t row_cap = 0;
    long long allocations = 0;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = lj_decode((const unsigned char*)stream.buf, (size_t)stream.len, scale_log2, x0, y0, x1, y1, (unsigned char*)out.buf,
                   (size_t)out.strides[0], &row, &row_cap, &allocations, msg);
    free(row);
    Py_END_ALLOW_THREADS
    if (ok) {
        result = Py_None;
        Py_INCREF(result);
    } else {
        result = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    }
done:
    PyBuffer_Release(&stream);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef Decoder_methods[] = {
    {"decode_tiles", (PyCFunction)Decoder_decode_tiles, METH_VARARGS, decode_tiles_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wsitool._jpegloop.Decoder",
    .tp_doc = "The reusable buffers of one thread's tile loop (tile bytes, RGB scratch, a crop row).\n\n"
              "Calls are serialised by the decoder's own mutex; wsitool keeps one per thread.",
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Decoder_new,
    .tp_init = (initproc)Decoder_init,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_methods = Decoder_methods,
};

static PyMethodDef module_methods[] = {
    {"load", jl_load, METH_VARARGS,
     "load(lib_path, extensions_path) -> version: open libnvimgcodec and create the instance (once)."},
    {"load_libjpeg", jl_load_libjpeg, METH_VARARGS,
     "load_libjpeg(path) -> API version: open libjpeg-turbo at path and look up its functions (once);\n"
     "ImportError for a library that is not libjpeg-turbo of the API the extension was built for."},
    {"decode_jpeg", jl_decode_jpeg, METH_VARARGS, decode_jpeg_doc},
    {"scatter", jl_scatter, METH_VARARGS,
     "scatter(src, dest, pieces): copy pieces of the C-contiguous (h, w, c) uint8 buffer src into the\n"
     "writable buffer dest, the GIL released; pieces: int64, 6 a piece (dest byte offset, dest row\n"
     "stride in bytes, y0, y1, x0, x1 of src).  ValueError if a piece reads or writes out of bounds."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "wsitool._jpegloop",
    "The per-tile loop of JPEG region reads in C (see wsitool/codec/jpegloop.py).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpegloop(void)
{
    if (PyType_Ready(&DecoderType) < 0)
        return NULL;
    PyObject* m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject*)&DecoderType) < 0) {
        Py_DECREF(&DecoderType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "HEADER_VERSION", NVIMGCODEC_VER);
    PyModule_AddIntConstant(m, "MAX_BATCH", MAX_BATCH);
    PyModule_AddIntConstant(m, "F_PAST_EOF", F_PAST_EOF);
    PyModule_AddIntConstant(m, "F_SHORT_READ", F_SHORT_READ);
    PyModule_AddIntConstant(m, "F_IO_ERROR", F_IO_ERROR);
    PyModule_AddIntConstant(m, "F_NOT_SOI", F_NOT_SOI);
    PyModule_AddIntConstant(m, "F_HEADER", F_HEADER);
    PyModule_AddIntConstant(m, "F_GRID", F_GRID);
    PyModule_AddIntConstant(m, "F_OUTSIDE", F_OUTSIDE);
    PyModule_AddIntConstant(m, "F_SUBSTREAM", F_SUBSTREAM);
    PyModule_AddIntConstant(m, "F_IMAGE", F_IMAGE);
    PyModule_AddIntConstant(m, "F_DECODE", F_DECODE);
    PyModule_AddIntConstant(m, "F_NO_SEGMENT", F_NO_SEGMENT);
    PyModule_AddIntConstant(m, "F_NO_MEMORY", F_NO_MEMORY);
    /* decode_tiles takes scan_segments (NDPI restart intervals) */
    PyModule_AddIntConstant(m, "SCAN_SEGMENTS", 1);
    /* decode_tiles takes dest and pieces (copied as soon as decoded); scatter() exists */
    PyModule_AddIntConstant(m, "SCATTER", 1);
    /* decode_tiles takes keep (pieces straight from a cache-resident tile scratch) and
     * dest2, pieces2 */
    PyModule_AddIntConstant(m, "SCATTER_KEEP", 1);
    PyModule_AddIntConstant(m, "EXTENTS", 1);
    /* decode_tiles splices an NDPI band's intervals into one code stream and returns `spliced` */
    PyModule_AddIntConstant(m, "SPLICE", 1);
    /* tiles are decoded by libjpeg-turbo (corrupt data fails); failures carry its message;
     * decode_jpeg() exists */
    PyModule_AddIntConstant(m, "LIBJPEG", 1);
    PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION);
    /* libjpeg-turbo is not linked: load_libjpeg(path) opens it */
    PyModule_AddIntConstant(m, "LIBJPEG_LOADED_AT_RUN_TIME", 1);
    return m;
}
