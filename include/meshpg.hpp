/*
 * meshpg.hpp - a thin, header-only C++17 layer over the C API of meshpg.h.
 *
 * It adds nothing the C API does not do; it only makes it hold itself:
 *  - Errors are exceptions.  Every wrapped call that returns a status other
 *    than MPG_OK throws meshpg::Error, which carries the mpg_status and the
 *    precise mpg_last_error() text of the failure site.
 *  - Handles are owners.  Mesh, Ctx, Sync, Topo and Placement own their C
 *    handle, are move-only and destroy it in their destructor (destructors
 *    never throw).  get() gives the C handle for calls not wrapped here;
 *    release() gives up ownership.  A moved-from or default-constructed
 *    owner is empty (get() is nullptr); its other members pass NULL to the
 *    C function they wrap, which meshpg.h says how it treats.
 *  - Spec is a value type (mpg_spec holds no pointers), copyable.
 *  - Group is a non-owning view of a mpg_group (groups belong to their
 *    context).  Its collectives are templates over the element type:
 *    float, double, int32_t and int64_t map to MPG_F32, MPG_F64, MPG_I32
 *    and MPG_I64 (dtype_v<T>).  f16 / bf16 buffers (no standard C++17
 *    type) go through the raw overloads that take a void pointer and an
 *    mpg_dtype.  Each collective has a blocking form and an _async form
 *    that returns a Work.
 *  - Work owns an asynchronous collective: wait() throws on failure; its
 *    destructor waits for work still pending (bounded by the context's
 *    timeout) and ignores the status.
 *  - run_threads runs simulated ranks (mpg_thread_run) with a
 *    std::function body and turns exceptions thrown in a rank into that
 *    rank's status and message.
 *
 * Lifetimes are those of the C API: a Mesh must outlive the Ctx and the
 * Placement made from it, a Ctx must outlive its Sync, Groups and Works.
 * Declare them in that order and C++ destroys them in the right one:
 *
 *   meshpg::Spec spec = meshpg::Spec::load_file("examples/seed.toml");
 *   meshpg::Mesh mesh(spec, 8);
 *   meshpg::Ctx ctx(mesh, opts);
 *   meshpg::Group tp = ctx.group("tp");
 *   tp.all_reduce(partial.data(), partial.size(), MPG_OP_SUM);
 *   meshpg::Sync sync(ctx, spec.sync_opts());
 *
 * Only <meshpg.h> and standard headers are used.  Link with -lmeshpg.
 */
#ifndef MESHPG_HPP
#define MESHPG_HPP

#include <meshpg.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace meshpg {

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

/* A failed meshpg call.  what() is "NAME: detail", e.g.
 * "ERR_SPEC: spec.toml:4:30: mesh.dims[1].size: expected ...". */
class Error : public std::runtime_error {
 public:
  /* An error of `status` with the message `detail` (when empty, the fixed
   * text of mpg_strerror(status) is used instead). */
  Error(mpg_status status, const std::string& detail)
      : std::runtime_error(std::string(mpg_status_name(status)) + ": " +
                           (detail.empty() ? std::string(mpg_strerror(status))
                                           : detail)),
        status_(status),
        detail_(detail.empty() ? std::string(mpg_strerror(status)) : detail) {}

  /* The status the C call returned (never MPG_OK). */
  mpg_status status() const noexcept { return status_; }
  /* Its symbolic name without the prefix: "ERR_TIMEOUT". */
  const char* name() const noexcept { return mpg_status_name(status_); }
  /* The message alone: mpg_last_error() of the failed call (or the
   * status's fixed text when the library left none). */
  const std::string& detail() const noexcept { return detail_; }

 private:
  mpg_status status_;
  std::string detail_;
};

/* Throw Error(status, mpg_last_error()) unless status is MPG_OK.  Call it
 * right after the failing C call: the message is thread-local and the next
 * meshpg call on the thread may replace it. */
inline void check(mpg_status status) {
  if (status != MPG_OK) throw Error(status, mpg_last_error());
}

/* ------------------------------------------------------------------------ */
/* Element types                                                             */
/* ------------------------------------------------------------------------ */

/* dtype_of<T>::value is the mpg_dtype of T, for the four C++ types that
 * have one (float, double, int32_t, int64_t).  Other types have no member
 * `value`, so the typed collectives reject them at compile time. */
template <class T>
struct dtype_of {};
template <>
struct dtype_of<float> : std::integral_constant<mpg_dtype, MPG_F32> {};
template <>
struct dtype_of<double> : std::integral_constant<mpg_dtype, MPG_F64> {};
template <>
struct dtype_of<std::int32_t> : std::integral_constant<mpg_dtype, MPG_I32> {};
template <>
struct dtype_of<std::int64_t> : std::integral_constant<mpg_dtype, MPG_I64> {};

/* True when T (cv-qualifiers ignored) has an mpg_dtype. */
template <class T, class = void>
struct has_dtype : std::false_type {};
template <class T>
struct has_dtype<T, std::void_t<decltype(dtype_of<std::remove_cv_t<T>>::value)>>
    : std::true_type {};
template <class T>
inline constexpr bool has_dtype_v = has_dtype<T>::value;

/* The mpg_dtype of T: dtype_v<float> == MPG_F32. */
template <class T>
inline constexpr mpg_dtype dtype_v = dtype_of<std::remove_cv_t<T>>::value;

namespace detail {
template <class T>
using if_dtype = std::enable_if_t<has_dtype_v<T>, int>;
}  // namespace detail

/* ------------------------------------------------------------------------ */
/* Spec                                                                      */
/* ------------------------------------------------------------------------ */

/* A mesh specification: an mpg_spec by value (copyable, nothing to free).
 * The mutators return *this so that calls chain; they do not validate (as
 * in C): call validate(), or let Mesh's constructor reject the spec. */
class Spec {
 public:
  /* Defaults and an empty mesh (MPG_SPEC_INIT). */
  Spec() = default;
  /* Wrap a copy of an existing C spec. */
  explicit Spec(const mpg_spec& spec) : spec_(spec) {}

  /* Read and validate a TOML file (mpg_spec_load_file).  Throws
   * ERR_IO / ERR_PARSE / ERR_SPEC with file:line:col in the message. */
  static Spec load_file(const std::string& path) {
    Spec s;
    check(mpg_spec_load_file(path.c_str(), &s.spec_));
    return s;
  }
  /* The same from TOML text; `name` is the file name used in messages
   * ("<string>" when empty). */
  static Spec load_string(const std::string& toml, const std::string& name = "") {
    Spec s;
    check(mpg_spec_load_string(toml.c_str(), name.empty() ? nullptr : name.c_str(),
                               &s.spec_));
    return s;
  }

  /* Replace the dims from "dp=2,cp=2,tp=2" (sizes may be -1 / auto);
   * flattened sets are kept (mpg_spec_set_mesh).  Throws ERR_SPEC. */
  Spec& set_mesh(const std::string& dims) {
    check(mpg_spec_set_mesh(&spec_, dims.c_str()));
    return *this;
  }
  /* Add or replace the flattened set `name` = "d1,d2" (mpg_spec_add_flatten). */
  Spec& add_flatten(const std::string& name, const std::string& dims) {
    check(mpg_spec_add_flatten(&spec_, name.c_str(), dims.c_str()));
    return *this;
  }
  /* Reorder the dims by a Megatron order string, innermost first:
   * "tp-cp-dp-pp" gives (pp, dp, cp, tp) (mpg_spec_apply_order). */
  Spec& apply_order(const std::string& order) {
    check(mpg_spec_apply_order(&spec_, order.c_str()));
    return *this;
  }
  /* Give the spec an expert (MoE) grid: expert tp (0: the mesh's tp), ep
   * (-1: inferred), order (Megatron's tokens, "" derives it from the mesh)
   * (mpg_spec_set_experts).  ep = 0 removes it.  Throws ERR_SPEC. */
  Spec& set_experts(int tp, int ep, const std::string& order = "") {
    check(mpg_spec_set_experts(&spec_, tp, ep, order.c_str()));
    return *this;
  }
  /* Check the spec (mpg_spec_validate).  Throws ERR_SPEC. */
  const Spec& validate() const {
    check(mpg_spec_validate(&spec_));
    return *this;
  }

  /* Options that hold this spec's sections (docs/c-api.md, "One home for
   * each setting"): MPG_SYNC_OPTS_INIT with .sync = [sync]. */
  mpg_sync_opts sync_opts() const {
    mpg_sync_opts o = MPG_SYNC_OPTS_INIT;
    o.sync = spec_.sync;
    return o;
  }
  /* MPG_INIT_OPTS_INIT with .backend = [backend] and .topology =
   * [topology]; rank and world still come from the launcher. */
  mpg_init_opts init_opts() const {
    mpg_init_opts o = MPG_INIT_OPTS_INIT;
    o.backend = spec_.backend;
    o.topology = spec_.topology;
    return o;
  }
  /* MPG_PLACEMENT_OPTS_INIT with .topology = [topology]. */
  mpg_placement_opts placement_opts() const {
    mpg_placement_opts o = MPG_PLACEMENT_OPTS_INIT;
    o.topology = spec_.topology;
    return o;
  }

  /* The C struct, to read or set any field: spec->backend.timeout_s. */
  mpg_spec* operator->() noexcept { return &spec_; }
  const mpg_spec* operator->() const noexcept { return &spec_; }
  /* Pointer to the C struct, for C calls. */
  mpg_spec* get() noexcept { return &spec_; }
  const mpg_spec* get() const noexcept { return &spec_; }

 private:
  mpg_spec spec_ = MPG_SPEC_INIT;
};

/* ------------------------------------------------------------------------ */
/* Mesh                                                                      */
/* ------------------------------------------------------------------------ */

/* One dim of a mesh. */
struct Dim {
  std::string name; /* "dp" */
  int size;         /* resolved size (> 0) */
};

/* A dim set (a dim, a flattened set, or "world") as mpg_mesh_dimset_info
 * describes it. */
struct DimsetInfo {
  std::string name; /* "dp_cp" */
  int group_size;   /* ranks in each of its groups */
  int num_groups;   /* how many groups it has */
};

/* Where a rank sits in its group of a dim set (mpg_mesh_group_of). */
struct GroupOf {
  int index;    /* which group of the dim set */
  int position; /* the rank's position in it */
  int size;     /* the group's size */
};

/* Owner of an mpg_mesh: named dims laid out row-major over the ranks.
 * Immutable once built, so one Mesh may be read by many threads. */
class Mesh {
 public:
  /* An empty owner (get() == nullptr). */
  Mesh() noexcept = default;
  /* Build from a spec (mpg_mesh_create); world_size 0 means the product
   * of the sizes.  Throws ERR_SPEC (world size vs product, bad spec). */
  explicit Mesh(const Spec& spec, int world_size = 0) {
    check(mpg_mesh_create(spec.get(), world_size, &mesh_));
  }
  /* Take ownership of a C mesh (may be nullptr). */
  explicit Mesh(mpg_mesh* mesh) noexcept : mesh_(mesh) {}
  /* Frees the mesh (mpg_mesh_destroy). */
  ~Mesh() { mpg_mesh_destroy(mesh_); }
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;
  /* Moves leave `other` empty. */
  Mesh(Mesh&& other) noexcept : mesh_(std::exchange(other.mesh_, nullptr)) {}
  /* Frees the mesh held so far, then takes `other`'s. */
  Mesh& operator=(Mesh&& other) noexcept {
    if (this != &other) {
      mpg_mesh_destroy(mesh_);
      mesh_ = std::exchange(other.mesh_, nullptr);
    }
    return *this;
  }

  /* The C handle (still owned by this object). */
  mpg_mesh* get() const noexcept { return mesh_; }
  /* Give up ownership: the caller must mpg_mesh_destroy the result. */
  mpg_mesh* release() noexcept { return std::exchange(mesh_, nullptr); }
  /* True when it holds a mesh. */
  explicit operator bool() const noexcept { return mesh_ != nullptr; }

  /* Number of ranks. */
  int world_size() const noexcept { return mpg_mesh_world_size(mesh_); }
  /* Number of dims. */
  int ndims() const noexcept { return mpg_mesh_ndims(mesh_); }
  /* Dim `d` (0 = outermost).  Throws ERR_RANGE. */
  Dim dim(int d) const {
    const char* name = nullptr;
    int size = 0;
    check(mpg_mesh_dim(mesh_, d, &name, &size));
    return Dim{name, size};
  }
  /* Every dim, outermost first. */
  std::vector<Dim> dims() const {
    std::vector<Dim> out;
    for (int d = 0; d < ndims(); d++) out.push_back(dim(d));
    return out;
  }
  /* The expert grid's dims (etp, ep, edp, pp in its order), outermost
   * first; empty without an expert grid (mpg_mesh_expert_dim). */
  std::vector<Dim> expert_dims() const {
    std::vector<Dim> out;
    for (int d = 0; d < mpg_mesh_expert_ndims(mesh_); d++) {
      const char* name = nullptr;
      int size = 0;
      check(mpg_mesh_expert_dim(mesh_, d, &name, &size));
      out.push_back(Dim{name, size});
    }
    return out;
  }

  /* Number of dim sets: dims, flattened sets, then "world". */
  int num_dimsets() const noexcept { return mpg_mesh_num_dimsets(mesh_); }
  /* Id of the dim set `name` (mpg_mesh_dimset_find).  Throws ERR_NOT_FOUND
   * naming the known sets. */
  int dimset(const std::string& name) const {
    int id = -1;
    check(mpg_mesh_dimset_find(mesh_, name.c_str(), &id));
    return id;
  }
  /* True when `name` is a dim, a flattened set or "world".  When false the
   * library's "not found" message is left in mpg_last_error(). */
  bool has(const std::string& name) const noexcept {
    int id = -1;
    return mpg_mesh_dimset_find(mesh_, name.c_str(), &id) == MPG_OK;
  }
  /* Name, group size and group count of dim set `dimset`.  Throws ERR_RANGE. */
  DimsetInfo dimset_info(int dimset) const {
    const char* name = nullptr;
    int size = 0, groups = 0;
    check(mpg_mesh_dimset_info(mesh_, dimset, &name, &size, &groups));
    return DimsetInfo{name, size, groups};
  }
  /* The mesh dim indices of dim set `dimset`, in mesh order. */
  std::vector<int> dimset_dims(int dimset) const {
    int dims[MPG_MAX_DIMS];
    int n = 0;
    check(mpg_mesh_dimset_dims(mesh_, dimset, dims, &n));
    return std::vector<int>(dims, dims + n);
  }

  /* Coordinate of `rank` (one entry per dim).  Throws ERR_RANGE. */
  std::vector<int> coord_of(int rank) const {
    std::vector<int> c(static_cast<std::size_t>(ndims()));
    check(mpg_mesh_coord_of(mesh_, rank, c.data()));
    return c;
  }
  /* Rank at coordinate `coord` (ndims entries).  Throws ERR_RANGE, or
   * ERR_INVALID when coord has the wrong length. */
  int rank_of(const std::vector<int>& coord) const {
    if (coord.size() != static_cast<std::size_t>(ndims()))
      throw Error(MPG_ERR_INVALID, "Mesh::rank_of: the coordinate has " +
                                       std::to_string(coord.size()) +
                                       " entries, the mesh " +
                                       std::to_string(ndims()) + " dims");
    int rank = -1;
    check(mpg_mesh_rank_of(mesh_, coord.data(), &rank));
    return rank;
  }
  /* The group of `rank` along `dimset`: its index, the rank's position
   * and the size (mpg_mesh_group_of). */
  GroupOf group_of(int dimset, int rank) const {
    GroupOf g{-1, -1, 0};
    check(mpg_mesh_group_of(mesh_, dimset, rank, &g.index, &g.position, &g.size));
    return g;
  }
  /* World rank at `position` of group `group_index` of `dimset`. */
  int group_member(int dimset, int group_index, int position) const {
    int rank = -1;
    check(mpg_mesh_group_member(mesh_, dimset, group_index, position, &rank));
    return rank;
  }
  /* Members of group `group_index` of `dimset`, in position order. */
  std::vector<int> group_members(int dimset, int group_index) const {
    std::vector<int> ranks(static_cast<std::size_t>(dimset_info(dimset).group_size));
    check(mpg_mesh_group_members(mesh_, dimset, group_index, ranks.data()));
    return ranks;
  }

 private:
  mpg_mesh* mesh_ = nullptr;
};

/* ------------------------------------------------------------------------ */
/* Asynchronous work                                                         */
/* ------------------------------------------------------------------------ */

/* Owner of an mpg_work (an asynchronous collective).  Move-only.  An empty
 * Work (default, moved-from, waited, or work that finished at once) is not
 * pending: wait() returns at once and test() returns true. */
class Work {
 public:
  /* Nothing pending. */
  Work() noexcept = default;
  /* Take ownership of a C work handle (nullptr: nothing pending). */
  explicit Work(mpg_work* work) noexcept : work_(work) {}
  /* Waits for work still pending (up to the context's timeout) and
   * releases it; a failure is ignored here: call wait() to see it. */
  ~Work() { (void)mpg_work_wait(work_); }
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  /* Moves leave `other` empty. */
  Work(Work&& other) noexcept : work_(std::exchange(other.work_, nullptr)) {}
  /* Waits for (and releases) the work held so far, ignoring its status,
   * then takes `other`'s. */
  Work& operator=(Work&& other) noexcept {
    if (this != &other) {
      (void)mpg_work_wait(work_);
      work_ = std::exchange(other.work_, nullptr);
    }
    return *this;
  }

  /* Wait for the work and release it, whatever the outcome
   * (mpg_work_wait); the Work is empty afterwards.  Throws the
   * collective's error: ERR_TIMEOUT (the context is then aborted),
   * ERR_ABORTED, ... */
  void wait() { check(mpg_work_wait(std::exchange(work_, nullptr))); }
  /* True when the work has finished (mpg_work_test); it stays owned until
   * wait() or destruction.  Throws the collective's error if it failed (the
   * handle is still released by wait() or the destructor). */
  bool test() {
    if (!work_) return true;
    int done = 0;
    check(mpg_work_test(work_, &done));
    return done != 0;
  }
  /* True while it holds a handle not yet waited for. */
  bool pending() const noexcept { return work_ != nullptr; }
  /* The C handle (still owned). */
  mpg_work* get() const noexcept { return work_; }
  /* Give up ownership: the caller must mpg_work_wait the result. */
  mpg_work* release() noexcept { return std::exchange(work_, nullptr); }

 private:
  mpg_work* work_ = nullptr;
};

/* ------------------------------------------------------------------------ */
/* Groups and collectives                                                    */
/* ------------------------------------------------------------------------ */

/* A non-owning view of a group (a communicator of one dim set, as seen by
 * this rank).  The group belongs to its context: a Group must not be used
 * after the Ctx is destroyed.  Cheap to copy.  An empty Group (default,
 * or a non-member's Ctx::group_select) has get() == nullptr.
 *
 * Collectives follow meshpg.h: every member of the group makes the same
 * calls in the same order; buffers are host memory on thread/mpi and
 * device memory on nccl (`stream` is the caller's cudaStream_t there,
 * ignored elsewhere); send == recv is allowed.  The blocking forms throw
 * Error on failure (ERR_INVALID, ERR_TIMEOUT, ERR_ABORTED, ERR_BACKEND).
 * The _async forms return a Work; the buffers must stay valid and unchanged
 * until it completes.  `count` is always a number of elements. */
class Group {
 public:
  /* An empty view. */
  Group() noexcept = default;
  /* View a C group (may be nullptr). */
  explicit Group(mpg_group* group) noexcept : group_(group) {}

  /* The C handle (belongs to the context). */
  mpg_group* get() const noexcept { return group_; }
  /* True when it views a group. */
  explicit operator bool() const noexcept { return group_ != nullptr; }

  /* Dim-set name: "tp", "dp_cp", "world". */
  std::string name() const { return mpg_group_name(group_); }
  /* This rank's position in the group. */
  int position() const noexcept { return mpg_group_position(group_); }
  /* Number of members. */
  int size() const noexcept { return mpg_group_size(group_); }
  /* Which group of its dim set this is. */
  int index() const noexcept { return mpg_group_index(group_); }
  /* World rank of the member at `position`.  Throws ERR_RANGE. */
  int member(int position) const {
    int rank = -1;
    check(mpg_group_member(group_, position, &rank));
    return rank;
  }
  /* World ranks of every member, in position order. */
  std::vector<int> members() const {
    std::vector<int> out;
    for (int p = 0; p < size(); p++) out.push_back(member(p));
    return out;
  }

  /* --- all_reduce: recv[i] = op over members of send[i] --------------- */

  /* Typed: float, double, int32_t, int64_t. */
  template <class T, detail::if_dtype<T> = 0>
  void all_reduce(const T* send, T* recv, std::size_t count, mpg_op op = MPG_OP_SUM,
                  void* stream = nullptr) {
    check(mpg_all_reduce(group_, send, recv, count, dtype_v<T>, op, stream, nullptr));
  }
  /* Typed, in place. */
  template <class T, detail::if_dtype<T> = 0>
  void all_reduce(T* buf, std::size_t count, mpg_op op = MPG_OP_SUM,
                  void* stream = nullptr) {
    all_reduce(buf, buf, count, op, stream);
  }
  /* Typed, in place over a whole vector. */
  template <class T, detail::if_dtype<T> = 0>
  void all_reduce(std::vector<T>& buf, mpg_op op = MPG_OP_SUM) {
    all_reduce(buf.data(), buf.data(), buf.size(), op, nullptr);
  }
  /* Typed, one value (host memory): returns op over the members' values. */
  template <class T, detail::if_dtype<T> = 0>
  T all_reduce_value(T value, mpg_op op = MPG_OP_SUM) {
    all_reduce(&value, &value, 1, op, nullptr);
    return value;
  }
  /* Raw dtype (f16 and bf16 buffers; any dtype). */
  void all_reduce(const void* send, void* recv, std::size_t count, mpg_dtype dtype,
                  mpg_op op, void* stream = nullptr) {
    check(mpg_all_reduce(group_, send, recv, count, dtype, op, stream, nullptr));
  }
  /* Asynchronous, typed. */
  template <class T, detail::if_dtype<T> = 0>
  Work all_reduce_async(const T* send, T* recv, std::size_t count,
                        mpg_op op = MPG_OP_SUM, void* stream = nullptr) {
    return all_reduce_async(send, recv, count, dtype_v<T>, op, stream);
  }
  /* Asynchronous, raw dtype. */
  Work all_reduce_async(const void* send, void* recv, std::size_t count,
                        mpg_dtype dtype, mpg_op op, void* stream = nullptr) {
    mpg_work* w = nullptr;
    mpg_status st = mpg_all_reduce(group_, send, recv, count, dtype, op, stream, &w);
    return posted(st, w);
  }

  /* --- all_reduce_scaled: recv[i] = sum over members of scale*send[i] -- */

  /* Typed (float, double; integer types are rejected by the library). */
  template <class T, detail::if_dtype<T> = 0>
  void all_reduce_scaled(const T* send, T* recv, std::size_t count, double scale,
                         void* stream = nullptr) {
    check(mpg_all_reduce_scaled(group_, send, recv, count, dtype_v<T>, scale, stream,
                                nullptr));
  }
  /* Raw dtype. */
  void all_reduce_scaled(const void* send, void* recv, std::size_t count,
                         mpg_dtype dtype, double scale, void* stream = nullptr) {
    check(mpg_all_reduce_scaled(group_, send, recv, count, dtype, scale, stream, nullptr));
  }
  /* Asynchronous, typed. */
  template <class T, detail::if_dtype<T> = 0>
  Work all_reduce_scaled_async(const T* send, T* recv, std::size_t count, double scale,
                               void* stream = nullptr) {
    return all_reduce_scaled_async(send, recv, count, dtype_v<T>, scale, stream);
  }
  /* Asynchronous, raw dtype. */
  Work all_reduce_scaled_async(const void* send, void* recv, std::size_t count,
                               mpg_dtype dtype, double scale, void* stream = nullptr) {
    mpg_work* w = nullptr;
    mpg_status st =
        mpg_all_reduce_scaled(group_, send, recv, count, dtype, scale, stream, &w);
    return posted(st, w);
  }

  /* --- broadcast: buf on every member = buf of the member at root ------ */

  /* Typed. */
  template <class T, detail::if_dtype<T> = 0>
  void broadcast(T* buf, std::size_t count, int root, void* stream = nullptr) {
    check(mpg_broadcast(group_, buf, count, dtype_v<T>, root, stream, nullptr));
  }
  /* Typed, a whole vector (every member's vector must have the same size). */
  template <class T, detail::if_dtype<T> = 0>
  void broadcast(std::vector<T>& buf, int root) {
    broadcast(buf.data(), buf.size(), root, nullptr);
  }
  /* Raw dtype. */
  void broadcast(void* buf, std::size_t count, mpg_dtype dtype, int root,
                 void* stream = nullptr) {
    check(mpg_broadcast(group_, buf, count, dtype, root, stream, nullptr));
  }
  /* Asynchronous, typed. */
  template <class T, detail::if_dtype<T> = 0>
  Work broadcast_async(T* buf, std::size_t count, int root, void* stream = nullptr) {
    return broadcast_async(static_cast<void*>(buf), count, dtype_v<T>, root, stream);
  }
  /* Asynchronous, raw dtype. */
  Work broadcast_async(void* buf, std::size_t count, mpg_dtype dtype, int root,
                       void* stream = nullptr) {
    mpg_work* w = nullptr;
    mpg_status st = mpg_broadcast(group_, buf, count, dtype, root, stream, &w);
    return posted(st, w);
  }

  /* --- all_gather: recv (size()*count) = every member's send in order -- */

  /* Typed. */
  template <class T, detail::if_dtype<T> = 0>
  void all_gather(const T* send, T* recv, std::size_t count, void* stream = nullptr) {
    check(mpg_all_gather(group_, send, recv, count, dtype_v<T>, stream, nullptr));
  }
  /* Typed, returning a new vector of size() * send.size() elements. */
  template <class T, detail::if_dtype<T> = 0>
  std::vector<T> all_gather(const std::vector<T>& send) {
    std::vector<T> recv(send.size() * static_cast<std::size_t>(size()));
    all_gather(send.data(), recv.data(), send.size(), nullptr);
    return recv;
  }
  /* Raw dtype. */
  void all_gather(const void* send, void* recv, std::size_t count, mpg_dtype dtype,
                  void* stream = nullptr) {
    check(mpg_all_gather(group_, send, recv, count, dtype, stream, nullptr));
  }
  /* Asynchronous, typed. */
  template <class T, detail::if_dtype<T> = 0>
  Work all_gather_async(const T* send, T* recv, std::size_t count,
                        void* stream = nullptr) {
    return all_gather_async(static_cast<const void*>(send), static_cast<void*>(recv),
                            count, dtype_v<T>, stream);
  }
  /* Asynchronous, raw dtype. */
  Work all_gather_async(const void* send, void* recv, std::size_t count,
                        mpg_dtype dtype, void* stream = nullptr) {
    mpg_work* w = nullptr;
    mpg_status st = mpg_all_gather(group_, send, recv, count, dtype, stream, &w);
    return posted(st, w);
  }

  /* --- reduce_scatter: send has size()*count; member p gets block p ---- */

  /* Typed. */
  template <class T, detail::if_dtype<T> = 0>
  void reduce_scatter(const T* send, T* recv, std::size_t count, mpg_op op = MPG_OP_SUM,
                      void* stream = nullptr) {
    check(mpg_reduce_scatter(group_, send, recv, count, dtype_v<T>, op, stream, nullptr));
  }
  /* Raw dtype. */
  void reduce_scatter(const void* send, void* recv, std::size_t count, mpg_dtype dtype,
                      mpg_op op, void* stream = nullptr) {
    check(mpg_reduce_scatter(group_, send, recv, count, dtype, op, stream, nullptr));
  }
  /* Asynchronous, typed. */
  template <class T, detail::if_dtype<T> = 0>
  Work reduce_scatter_async(const T* send, T* recv, std::size_t count,
                            mpg_op op = MPG_OP_SUM, void* stream = nullptr) {
    return reduce_scatter_async(static_cast<const void*>(send), static_cast<void*>(recv),
                                count, dtype_v<T>, op, stream);
  }
  /* Asynchronous, raw dtype. */
  Work reduce_scatter_async(const void* send, void* recv, std::size_t count,
                            mpg_dtype dtype, mpg_op op, void* stream = nullptr) {
    mpg_work* w = nullptr;
    mpg_status st = mpg_reduce_scatter(group_, send, recv, count, dtype, op, stream, &w);
    return posted(st, w);
  }

  /* --- barrier ---------------------------------------------------------- */

  /* Returns when every member has entered it. */
  void barrier() { check(mpg_barrier(group_, nullptr)); }
  /* Asynchronous barrier. */
  Work barrier_async() {
    mpg_work* w = nullptr;
    mpg_status st = mpg_barrier(group_, &w);
    return posted(st, w);
  }

  /* --- all_to_all: block j of send to member j; block i of recv from i -- */

  /* Typed: send and recv hold size() * count elements. */
  template <class T, detail::if_dtype<T> = 0>
  void all_to_all(const T* send, T* recv, std::size_t count, void* stream = nullptr) {
    check(mpg_all_to_all(group_, send, recv, count, dtype_v<T>, stream, nullptr));
  }
  /* Typed, returning a new vector of send.size() elements (send.size()
   * must be a multiple of size(): ERR_INVALID otherwise). */
  template <class T, detail::if_dtype<T> = 0>
  std::vector<T> all_to_all(const std::vector<T>& send) {
    std::size_t n = static_cast<std::size_t>(size());
    if (n == 0 || send.size() % n != 0)
      throw Error(MPG_ERR_INVALID, "Group::all_to_all: " + std::to_string(send.size()) +
                                       " elements do not split into " + std::to_string(n) +
                                       " equal blocks");
    std::vector<T> recv(send.size());
    all_to_all(send.data(), recv.data(), send.size() / n, nullptr);
    return recv;
  }
  /* Raw dtype. */
  void all_to_all(const void* send, void* recv, std::size_t count, mpg_dtype dtype,
                  void* stream = nullptr) {
    check(mpg_all_to_all(group_, send, recv, count, dtype, stream, nullptr));
  }
  /* Asynchronous, typed. */
  template <class T, detail::if_dtype<T> = 0>
  Work all_to_all_async(const T* send, T* recv, std::size_t count, void* stream = nullptr) {
    return all_to_all_async(static_cast<const void*>(send), static_cast<void*>(recv), count,
                            dtype_v<T>, stream);
  }
  /* Asynchronous, raw dtype. */
  Work all_to_all_async(const void* send, void* recv, std::size_t count, mpg_dtype dtype,
                        void* stream = nullptr) {
    mpg_work* w = nullptr;
    mpg_status st = mpg_all_to_all(group_, send, recv, count, dtype, stream, &w);
    return posted(st, w);
  }

  /* --- all_to_all_v: per-peer counts and displacements, in elements ---- */

  /* Typed; the four arrays have size() entries (see mpg_all_to_all_v). */
  template <class T, detail::if_dtype<T> = 0>
  void all_to_all_v(const T* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, T* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, void* stream = nullptr) {
    check(mpg_all_to_all_v(group_, send, send_counts, send_displs, recv, recv_counts,
                           recv_displs, dtype_v<T>, stream, nullptr));
  }
  /* Typed, packed: send holds the blocks for members 0, 1, ... back to
   * back (send_counts[j] elements for member j); returns the blocks from
   * members 0, 1, ... back to back (recv_counts[i] from member i).  Both
   * count vectors need size() entries and send the sum of send_counts
   * elements: ERR_INVALID otherwise. */
  template <class T, detail::if_dtype<T> = 0>
  std::vector<T> all_to_all_v(const std::vector<T>& send,
                              const std::vector<std::size_t>& send_counts,
                              const std::vector<std::size_t>& recv_counts) {
    std::size_t n = static_cast<std::size_t>(size());
    std::vector<std::size_t> sd(n), rd(n);
    std::size_t st = 0, rt = 0;
    for (std::size_t p = 0; p < n && p < send_counts.size() && p < recv_counts.size(); p++) {
      sd[p] = st;
      st += send_counts[p];
      rd[p] = rt;
      rt += recv_counts[p];
    }
    if (send_counts.size() != n || recv_counts.size() != n || st != send.size())
      throw Error(MPG_ERR_INVALID,
                  "Group::all_to_all_v: expected " + std::to_string(n) +
                      " send and receive counts and send.size() == their sum, found " +
                      std::to_string(send_counts.size()) + ", " +
                      std::to_string(recv_counts.size()) + " and " +
                      std::to_string(send.size()));
    std::vector<T> recv(rt);
    all_to_all_v(send.data(), send_counts.data(), sd.data(), recv.data(), recv_counts.data(),
                 rd.data(), nullptr);
    return recv;
  }
  /* Raw dtype. */
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, mpg_dtype dtype, void* stream = nullptr) {
    check(mpg_all_to_all_v(group_, send, send_counts, send_displs, recv, recv_counts,
                           recv_displs, dtype, stream, nullptr));
  }
  /* Asynchronous, typed (the arrays may be reused at once). */
  template <class T, detail::if_dtype<T> = 0>
  Work all_to_all_v_async(const T* send, const std::size_t* send_counts,
                          const std::size_t* send_displs, T* recv,
                          const std::size_t* recv_counts, const std::size_t* recv_displs,
                          void* stream = nullptr) {
    return all_to_all_v_async(static_cast<const void*>(send), send_counts, send_displs,
                              static_cast<void*>(recv), recv_counts, recv_displs, dtype_v<T>,
                              stream);
  }
  /* Asynchronous, raw dtype. */
  Work all_to_all_v_async(const void* send, const std::size_t* send_counts,
                          const std::size_t* send_displs, void* recv,
                          const std::size_t* recv_counts, const std::size_t* recv_displs,
                          mpg_dtype dtype, void* stream = nullptr) {
    mpg_work* w = nullptr;
    mpg_status st = mpg_all_to_all_v(group_, send, send_counts, send_displs, recv,
                                     recv_counts, recv_displs, dtype, stream, &w);
    return posted(st, w);
  }

  /* --- point to point with the member at position `peer` --------------- */

  /* Typed send. */
  template <class T, detail::if_dtype<T> = 0>
  void send(const T* buf, std::size_t count, int peer, void* stream = nullptr) {
    check(mpg_send(group_, buf, count, dtype_v<T>, peer, stream, nullptr));
  }
  /* Raw-dtype send. */
  void send(const void* buf, std::size_t count, mpg_dtype dtype, int peer,
            void* stream = nullptr) {
    check(mpg_send(group_, buf, count, dtype, peer, stream, nullptr));
  }
  /* Typed receive. */
  template <class T, detail::if_dtype<T> = 0>
  void recv(T* buf, std::size_t count, int peer, void* stream = nullptr) {
    check(mpg_recv(group_, buf, count, dtype_v<T>, peer, stream, nullptr));
  }
  /* Raw-dtype receive. */
  void recv(void* buf, std::size_t count, mpg_dtype dtype, int peer,
            void* stream = nullptr) {
    check(mpg_recv(group_, buf, count, dtype, peer, stream, nullptr));
  }
  /* Asynchronous typed send. */
  template <class T, detail::if_dtype<T> = 0>
  Work send_async(const T* buf, std::size_t count, int peer, void* stream = nullptr) {
    return send_async(static_cast<const void*>(buf), count, dtype_v<T>, peer, stream);
  }
  /* Asynchronous raw-dtype send. */
  Work send_async(const void* buf, std::size_t count, mpg_dtype dtype, int peer,
                  void* stream = nullptr) {
    mpg_work* w = nullptr;
    mpg_status st = mpg_send(group_, buf, count, dtype, peer, stream, &w);
    return posted(st, w);
  }
  /* Asynchronous typed receive. */
  template <class T, detail::if_dtype<T> = 0>
  Work recv_async(T* buf, std::size_t count, int peer, void* stream = nullptr) {
    return recv_async(static_cast<void*>(buf), count, dtype_v<T>, peer, stream);
  }
  /* Asynchronous raw-dtype receive. */
  Work recv_async(void* buf, std::size_t count, mpg_dtype dtype, int peer,
                  void* stream = nullptr) {
    mpg_work* w = nullptr;
    mpg_status st = mpg_recv(group_, buf, count, dtype, peer, stream, &w);
    return posted(st, w);
  }

  /* --- batched point to point (mpg_p2p_batch) ------------------------- */

  /* One send of a batch: count elements of buf to the member at `peer`. */
  static mpg_p2p_op send_op(const void* buf, std::size_t count, mpg_dtype dtype,
                            int peer) noexcept {
    return mpg_p2p_op{MPG_P2P_SEND, peer, const_cast<void*>(buf), count, dtype};
  }
  template <class T, detail::if_dtype<T> = 0>
  static mpg_p2p_op send_op(const T* buf, std::size_t count, int peer) noexcept {
    return send_op(static_cast<const void*>(buf), count, dtype_v<T>, peer);
  }
  /* One receive of a batch: count elements into buf from `peer`. */
  static mpg_p2p_op recv_op(void* buf, std::size_t count, mpg_dtype dtype,
                            int peer) noexcept {
    return mpg_p2p_op{MPG_P2P_RECV, peer, buf, count, dtype};
  }
  template <class T, detail::if_dtype<T> = 0>
  static mpg_p2p_op recv_op(T* buf, std::size_t count, int peer) noexcept {
    return recv_op(static_cast<void*>(buf), count, dtype_v<T>, peer);
  }
  /* Issue the sends and receives as one batch (no operation waits for
   * another: a two-way exchange between pipeline stages cannot deadlock)
   * and wait for all.  Every operation is checked before any is posted.
   * Throws ERR_INVALID (naming ops[i]), ERR_RANGE, ERR_TIMEOUT, ... */
  void p2p_batch(const std::vector<mpg_p2p_op>& ops, void* stream = nullptr) {
    check(mpg_p2p_batch(group_, ops.data(), batch_size(ops), stream, nullptr));
  }
  /* The same, returning one Work for the whole batch. */
  Work p2p_batch_async(const std::vector<mpg_p2p_op>& ops, void* stream = nullptr) {
    mpg_work* w = nullptr;
    mpg_status st = mpg_p2p_batch(group_, ops.data(), batch_size(ops), stream, &w);
    return posted(st, w);
  }

 private:
  /* The batch's length as the C call's int (-1, refused, beyond INT_MAX). */
  static int batch_size(const std::vector<mpg_p2p_op>& ops) noexcept {
    return ops.size() > static_cast<std::size_t>(INT_MAX) ? -1 : static_cast<int>(ops.size());
  }

  /* Own whatever handle was returned, then throw on failure. */
  static Work posted(mpg_status st, mpg_work* w) {
    Work work(w);
    check(st);
    return work;
  }

  mpg_group* group_ = nullptr;
};

/* ------------------------------------------------------------------------ */
/* Context                                                                   */
/* ------------------------------------------------------------------------ */

/* Owner of an mpg_ctx: this rank's view of the job, with every group of its
 * mesh.  Move-only.  The Mesh it was made from must outlive it. */
class Ctx {
 public:
  /* An empty owner. */
  Ctx() noexcept = default;
  /* Join the world and create this rank's groups (mpg_ctx_create);
   * collective over the world.  Throws ERR_ENV, ERR_INVALID,
   * ERR_UNSUPPORTED, ERR_BACKEND, ERR_TIMEOUT, ERR_TOPO. */
  Ctx(const Mesh& mesh, const mpg_init_opts& opts)
      : unwinding_(std::uncaught_exceptions()) {
    check(mpg_ctx_create(mesh.get(), &opts, &ctx_));
  }
  /* The same with every option from the launch environment (NULL opts:
   * thread backend). */
  explicit Ctx(const Mesh& mesh) : unwinding_(std::uncaught_exceptions()) {
    check(mpg_ctx_create(mesh.get(), nullptr, &ctx_));
  }
  /* Take ownership of a C context (may be nullptr). */
  explicit Ctx(mpg_ctx* ctx) noexcept : ctx_(ctx), unwinding_(std::uncaught_exceptions()) {}
  /* Frees the context (mpg_ctx_destroy).  When it is destroyed by stack
   * unwinding (an exception thrown after it was made is in flight), it
   * first aborts the context (mpg_ctx_abort), so that peers waiting on this
   * rank in a collective fail with MPG_ERR_ABORTED (thread backend) or
   * their timeout rather than waiting for a rank that is gone. */
  ~Ctx() { free_ctx(); }
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;
  /* Moves leave `other` empty. */
  Ctx(Ctx&& other) noexcept
      : ctx_(std::exchange(other.ctx_, nullptr)), unwinding_(other.unwinding_) {}
  /* Frees the context held so far, then takes `other`'s. */
  Ctx& operator=(Ctx&& other) noexcept {
    if (this != &other) {
      free_ctx();
      ctx_ = std::exchange(other.ctx_, nullptr);
      unwinding_ = other.unwinding_;
    }
    return *this;
  }

  /* Free the context now and report the status the destructor would
   * ignore.  Empty afterwards.  Throws the first backend error. */
  void close() { check(mpg_ctx_destroy(std::exchange(ctx_, nullptr))); }

  /* The C handle (still owned). */
  mpg_ctx* get() const noexcept { return ctx_; }
  /* Give up ownership: the caller must mpg_ctx_destroy the result. */
  mpg_ctx* release() noexcept { return std::exchange(ctx_, nullptr); }
  /* True when it holds a context. */
  explicit operator bool() const noexcept { return ctx_ != nullptr; }

  /* This rank in the mesh. */
  int rank() const noexcept { return mpg_ctx_rank(ctx_); }
  /* Number of ranks. */
  int world_size() const noexcept { return mpg_ctx_world_size(ctx_); }
  /* The rank the launcher gave this process. */
  int launcher_rank() const noexcept { return mpg_ctx_launcher_rank(ctx_); }
  /* Local rank on the node. */
  int local_rank() const noexcept { return mpg_ctx_local_rank(ctx_); }
  /* Nodes found by placement (1 without it). */
  int num_nodes() const noexcept { return mpg_ctx_num_nodes(ctx_); }
  /* The backend in use. */
  mpg_backend_kind backend() const noexcept { return mpg_ctx_backend(ctx_); }
  /* The mesh (belongs to the caller who built the context). */
  const mpg_mesh* mesh() const noexcept { return mpg_ctx_mesh(ctx_); }
  /* MPG_OK while healthy; after a timeout or abort, the reason. */
  mpg_status status() const noexcept { return mpg_ctx_status(ctx_); }
  /* Abort every communicator (mpg_ctx_abort): safe from another thread,
   * never blocks.  The context must still be destroyed. */
  void abort() noexcept { (void)mpg_ctx_abort(ctx_); }
  /* Write the flight recorder's ring to dir/rank-R.trace
   * (mpg_ctx_trace_dump; nullptr: the context's trace directory). */
  void trace_dump(const char* dir = nullptr) { check(mpg_ctx_trace_dump(ctx_, dir)); }
  /* The timeout of every operation that starts from now on
   * (mpg_ctx_set_timeout): e.g. long for start-up, short for the steps. */
  void set_timeout(double seconds) { check(mpg_ctx_set_timeout(ctx_, seconds)); }
  /* What opts.bind did (mpg_ctx_get_binding). */
  mpg_binding binding() const {
    mpg_binding b = MPG_BINDING_INIT;
    check(mpg_ctx_get_binding(ctx_, &b));
    return b;
  }
  /* Check that the ranks issued their collectives in one order since the
   * last check (mpg_ctx_check_order; collective over the world, a no-op
   * with the checker off).  Throws ERR_STATE naming the first difference. */
  void check_order() { check(mpg_ctx_check_order(ctx_)); }

  /* This rank's group of a dim set: "dp", "tp", "dp_cp", "world"
   * (mpg_ctx_group).  Throws ERR_NOT_FOUND naming the unknown name. */
  Group group(const std::string& name) {
    mpg_group* g = nullptr;
    check(mpg_ctx_group(ctx_, name.c_str(), &g));
    return Group(g);
  }
  /* The same by dim-set id (mpg_ctx_group_at). */
  Group group_at(int dimset) {
    mpg_group* g = nullptr;
    check(mpg_ctx_group_at(ctx_, dimset, &g));
    return Group(g);
  }
  /* The group over a union of dims and sets, "dp_cp,tp"
   * (mpg_ctx_group_dims); the first call is collective over the world. */
  Group group_dims(const std::string& dims) {
    mpg_group* g = nullptr;
    check(mpg_ctx_group_dims(ctx_, dims.c_str(), &g));
    return Group(g);
  }
  /* The sub-group of the members of `name` at `positions`
   * (mpg_ctx_group_select); collective over the world.  Empty on ranks
   * that are not at one of the positions.  Throws ERR_RANGE. */
  Group group_select(const std::string& name, const std::vector<int>& positions) {
    mpg_group* g = nullptr;
    check(mpg_ctx_group_select(ctx_, name.c_str(), positions.data(),
                               static_cast<int>(positions.size()), &g));
    return Group(g);
  }

  /* Megatron's partial data-parallel group of `dims` cut into
   * `instances` parts (mpg_ctx_group_partial): the intra part holding this
   * rank, or with `inter` the members at its place in every part;
   * collective over the world.  Throws ERR_RANGE. */
  Group group_partial(const std::string& dims, int instances, bool inter = false) {
    mpg_group* g = nullptr;
    check(mpg_ctx_group_partial(ctx_, dims.c_str(), instances,
                                inter ? MPG_PARTIAL_INTER : MPG_PARTIAL_INTRA, &g));
    return Group(g);
  }

  /* Zeroed memory where the backend wants buffers (mpg_ctx_mem_alloc):
   * host on thread/mpi, device on nccl.  Free with mem_free. */
  void* mem_alloc(std::size_t bytes, bool registered = false) {
    void* p = nullptr;
    check(mpg_ctx_mem_alloc(ctx_, bytes, registered ? 1 : 0, &p));
    return p;
  }
  /* Free memory from mem_alloc. */
  void mem_free(void* ptr) { check(mpg_ctx_mem_free(ctx_, ptr)); }
  /* Zero `bytes` at ptr (on `stream` for nccl). */
  void mem_zero(void* ptr, std::size_t bytes, void* stream = nullptr) {
    check(mpg_ctx_mem_zero(ctx_, ptr, bytes, stream));
  }
  /* A new stream of the context's device (nullptr on thread/mpi). */
  void* stream_create() {
    void* s = nullptr;
    check(mpg_ctx_stream_create(ctx_, &s));
    return s;
  }
  /* Destroy a stream from stream_create. */
  void stream_destroy(void* stream) { check(mpg_ctx_stream_destroy(ctx_, stream)); }
  /* Work queued later on `waiter` starts after the work queued so far on
   * `waitee` (mpg_ctx_stream_order). */
  void stream_order(void* waiter, void* waitee) {
    check(mpg_ctx_stream_order(ctx_, waiter, waitee));
  }

 private:
  void free_ctx() noexcept {
    if (!ctx_) return;
    if (std::uncaught_exceptions() > unwinding_) (void)mpg_ctx_abort(ctx_);
    (void)mpg_ctx_destroy(std::exchange(ctx_, nullptr));
  }

  mpg_ctx* ctx_ = nullptr;
  int unwinding_ = 0; /* exceptions in flight when it was made */
};

/* ------------------------------------------------------------------------ */
/* Gradient synchronisation                                                  */
/* ------------------------------------------------------------------------ */

/* Per-parameter options (MPG_PARAM_OPTS_INIT with reduce_dims and
 * tied_group set).  The string is not copied: keep it alive until
 * Sync::add_param returns.  nullptr / an empty Group keep the defaults. */
inline mpg_param_opts param_opts(const char* reduce_dims, Group tied = Group()) {
  mpg_param_opts o = MPG_PARAM_OPTS_INIT;
  o.reduce_dims = reduce_dims;
  o.tied_group = tied.get();
  return o;
}

/* Owner of an mpg_sync (gradient synchronisation).  Move-only; used by one
 * thread at a time.  Its Ctx must outlive it. */
class Sync {
 public:
  /* An empty owner. */
  Sync() noexcept = default;
  /* Create a synchroniser (mpg_sync_create); may be collective over the
   * world.  Throws ERR_INVALID, ERR_NOT_FOUND, and group-creation errors. */
  Sync(Ctx& ctx, const mpg_sync_opts& opts) {
    check(mpg_sync_create(ctx.get(), &opts, &sync_));
  }
  /* The same with default options. */
  explicit Sync(Ctx& ctx) { check(mpg_sync_create(ctx.get(), nullptr, &sync_)); }
  /* Take ownership of a C synchroniser (may be nullptr). */
  explicit Sync(mpg_sync* sync) noexcept : sync_(sync) {}
  /* Frees it (mpg_sync_destroy; with a step open, this first waits for the
   * buckets in flight, up to the context's timeout). */
  ~Sync() { (void)mpg_sync_destroy(sync_); }
  Sync(const Sync&) = delete;
  Sync& operator=(const Sync&) = delete;
  /* Moves leave `other` empty. */
  Sync(Sync&& other) noexcept : sync_(std::exchange(other.sync_, nullptr)) {}
  /* Frees the synchroniser held so far, then takes `other`'s. */
  Sync& operator=(Sync&& other) noexcept {
    if (this != &other) {
      (void)mpg_sync_destroy(sync_);
      sync_ = std::exchange(other.sync_, nullptr);
    }
    return *this;
  }

  /* Free it now and report the status the destructor would ignore. */
  void close() { check(mpg_sync_destroy(std::exchange(sync_, nullptr))); }
  /* The C handle (still owned). */
  mpg_sync* get() const noexcept { return sync_; }
  /* Give up ownership: the caller must mpg_sync_destroy the result. */
  mpg_sync* release() noexcept { return std::exchange(sync_, nullptr); }
  /* True when it holds a synchroniser. */
  explicit operator bool() const noexcept { return sync_ != nullptr; }

  /* Register a parameter before commit (mpg_sync_add_param); returns its
   * id (0, 1, ... in registration order).  Throws ERR_STATE after commit,
   * ERR_INVALID, ERR_NOT_FOUND, ERR_RANGE. */
  int add_param(const std::string& name, std::size_t count, mpg_dtype dtype,
                const mpg_param_opts* opts = nullptr) {
    int id = -1;
    check(mpg_sync_add_param(sync_, name.c_str(), count, dtype, opts, &id));
    return id;
  }
  /* The same with the dtype of T: add_param<float>("w", n). */
  template <class T, detail::if_dtype<T> = 0>
  int add_param(const std::string& name, std::size_t count,
                const mpg_param_opts* opts = nullptr) {
    return add_param(name, count, dtype_v<T>, opts);
  }
  /* Lay out buffers and buckets (mpg_sync_commit); may be collective. */
  void commit() { check(mpg_sync_commit(sync_)); }

  /* The gradient view of `param` (valid until the Sync is destroyed).
   * Throws ERR_STATE before commit, ERR_RANGE for a bad id. */
  void* grad(int param) {
    void* g = nullptr;
    check(mpg_sync_grad(sync_, param, &g));
    return g;
  }
  /* The same, typed: grad<float>(id).  T must match the registered dtype. */
  template <class T, detail::if_dtype<T> = 0>
  T* grad(int param) {
    return static_cast<T*>(grad(param));
  }

  /* Start a step / micro-batch (mpg_sync_begin). */
  void begin(long step, bool is_last_microbatch, void* stream = nullptr) {
    check(mpg_sync_begin(sync_, step, is_last_microbatch ? 1 : 0, stream));
  }
  /* The gradient of `param` is complete (mpg_sync_mark_ready). */
  void mark_ready(int param) { check(mpg_sync_mark_ready(sync_, param)); }
  /* Launch what is left and wait for every bucket (mpg_sync_finish).
   * Throws the step's first error; grads_valid() is then false. */
  void finish() { check(mpg_sync_finish(sync_)); }
  /* begin (last micro-batch) + mark every param ready + finish. */
  void all(long step, void* stream = nullptr) { check(mpg_sync_all(sync_, step, stream)); }
  /* Zero every gradient (mpg_sync_zero_grads). */
  void zero_grads() { check(mpg_sync_zero_grads(sync_)); }
  /* False after a failed step, until the next good one. */
  bool grads_valid() const noexcept { return mpg_sync_grads_valid(sync_) != 0; }
  /* Layout facts (mpg_sync_get_stats). */
  mpg_sync_stats stats() const {
    mpg_sync_stats s = MPG_SYNC_STATS_INIT;
    check(mpg_sync_get_stats(sync_, &s));
    return s;
  }
  /* The reduce group of `param` (after commit). */
  Group param_group(int param) const {
    mpg_group* g = nullptr;
    check(mpg_sync_param_group(sync_, param, &g));
    return Group(g);
  }

  /* Shard mode (opts.mode = MPG_SYNC_SHARD).  This rank's range of `param`
   * (mpg_sync_get_shard). */
  mpg_shard_info shard(int param) const {
    mpg_shard_info i = MPG_SHARD_INFO_INIT;
    check(mpg_sync_get_shard(sync_, param, &i));
    return i;
  }
  /* The parameter view of `param` in the parameter buffer (mpg_sync_param). */
  void* param(int param_id) {
    void* p = nullptr;
    check(mpg_sync_param(sync_, param_id, &p));
    return p;
  }
  template <class T, detail::if_dtype<T> = 0>
  T* param(int param_id) {
    return static_cast<T*>(param(param_id));
  }
  /* Gathers of the updated params (mpg_sync_gather_begin / _wait / _all). */
  void gather_begin(void* stream = nullptr) { check(mpg_sync_gather_begin(sync_, stream)); }
  void gather_wait(int param_id) { check(mpg_sync_gather_wait(sync_, param_id)); }
  void gather_all() { check(mpg_sync_gather_all(sync_)); }

 private:
  mpg_sync* sync_ = nullptr;
};

/* ------------------------------------------------------------------------ */
/* Checkpoints                                                               */
/* ------------------------------------------------------------------------ */

/* A layout (MPG_TENSOR_LAYOUT_INIT) of a global tensor of `shape`, whole;
 * set split_dims / split_axis, the box or the range on the result. */
inline mpg_tensor_layout tensor_layout(std::initializer_list<std::size_t> shape,
                                       const char* split_dims = nullptr, int split_axis = -1) {
  mpg_tensor_layout l = MPG_TENSOR_LAYOUT_INIT;
  l.ndim = 0;
  for (std::size_t v : shape)
    if (l.ndim < MPG_CKPT_MAX_NDIM) l.shape[l.ndim++] = v;
  l.split_dims = split_dims;
  l.split_axis = split_axis;
  return l;
}

/* Owner of an mpg_ckpt (a checkpoint handle: mpg_ckpt_create).  Move-only;
 * its Ctx must outlive it; context thread. */
class Checkpoint {
 public:
  /* An empty owner. */
  Checkpoint() noexcept = default;
  /* Create a handle (mpg_ckpt_create; opts nullptr: the defaults).
   * Throws ERR_INVALID. */
  explicit Checkpoint(Ctx& ctx, const mpg_ckpt_opts* opts = nullptr) {
    check(mpg_ckpt_create(ctx.get(), opts, &ck_));
  }
  /* Frees it (mpg_ckpt_destroy: waits for a save in flight, whose result
   * is then lost; call wait() first to see it). */
  ~Checkpoint() { (void)mpg_ckpt_destroy(ck_); }
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  /* Moves leave `other` empty. */
  Checkpoint(Checkpoint&& other) noexcept : ck_(std::exchange(other.ck_, nullptr)) {}
  /* Frees the handle held so far, then takes `other`'s. */
  Checkpoint& operator=(Checkpoint&& other) noexcept {
    if (this != &other) {
      (void)mpg_ckpt_destroy(ck_);
      ck_ = std::exchange(other.ck_, nullptr);
    }
    return *this;
  }
  /* The C handle (still owned). */
  mpg_ckpt* get() const noexcept { return ck_; }
  /* True when it holds a handle. */
  explicit operator bool() const noexcept { return ck_ != nullptr; }

  /* Register this rank's piece of a global tensor (mpg_ckpt_add); returns
   * its index. */
  int add(const std::string& name, mpg_dtype dtype, const mpg_tensor_layout& layout,
          void* data) {
    int id = -1;
    check(mpg_ckpt_add(ck_, name.c_str(), dtype, &layout, data, &id));
    return id;
  }
  /* The same with the dtype of T. */
  template <class T, detail::if_dtype<T> = 0>
  int add(const std::string& name, const mpg_tensor_layout& layout, T* data) {
    return add(name, dtype_v<T>, layout, data);
  }
  /* An optimizer-state array of a sync's param (mpg_ckpt_add_state). */
  void add_state(const std::string& name, mpg_dtype dtype, const mpg_tensor_layout& layout,
                 Sync& sync, int param, void* state) {
    check(mpg_ckpt_add_state(ck_, name.c_str(), dtype, &layout, sync.get(), param, state));
  }
  /* The trainer's own bytes (mpg_ckpt_add_bytes). */
  void add_bytes(const std::string& name, void* data, std::size_t len) {
    check(mpg_ckpt_add_bytes(ck_, name.c_str(), data, len));
  }
  /* Save (mpg_ckpt_save); collective over the world. */
  void save(const std::string& dir, long step, void* stream = nullptr) {
    check(mpg_ckpt_save(ck_, dir.c_str(), step, stream));
  }
  /* End the save in flight (mpg_ckpt_wait); collective. */
  void wait() { check(mpg_ckpt_wait(ck_)); }
  /* Load and return the saved step (mpg_ckpt_load); collective. */
  long load(const std::string& dir, void* stream = nullptr) {
    long step = 0;
    check(mpg_ckpt_load(ck_, dir.c_str(), &step, stream));
    return step;
  }
  /* Free it now and report the status the destructor would ignore. */
  void close() { check(mpg_ckpt_destroy(std::exchange(ck_, nullptr))); }

 private:
  mpg_ckpt* ck_ = nullptr;
};

/* ------------------------------------------------------------------------ */
/* Topology and placement                                                    */
/* ------------------------------------------------------------------------ */

/* Owner of an mpg_topo (hwloc topology).  Move-only.  The strings in the
 * info structs it returns belong to it. */
class Topo {
 public:
  /* An empty owner. */
  Topo() noexcept = default;
  /* Take ownership of a C topology (may be nullptr). */
  explicit Topo(mpg_topo* topo) noexcept : topo_(topo) {}
  /* This machine (mpg_topo_load_live).  Throws ERR_TOPO. */
  static Topo live() {
    mpg_topo* t = nullptr;
    check(mpg_topo_load_live(&t));
    return Topo(t);
  }
  /* An hwloc XML file (mpg_topo_load_xml).  Throws ERR_IO, ERR_TOPO. */
  static Topo load_xml(const std::string& path) {
    mpg_topo* t = nullptr;
    check(mpg_topo_load_xml(path.c_str(), &t));
    return Topo(t);
  }
  /* An hwloc synthetic description, "pack:2 numa:1 core:32 pu:2"
   * (mpg_topo_load_synthetic).  Throws ERR_TOPO. */
  static Topo load_synthetic(const std::string& description) {
    mpg_topo* t = nullptr;
    check(mpg_topo_load_synthetic(description.c_str(), &t));
    return Topo(t);
  }
  /* Frees the topology (mpg_topo_destroy). */
  ~Topo() { mpg_topo_destroy(topo_); }
  Topo(const Topo&) = delete;
  Topo& operator=(const Topo&) = delete;
  /* Moves leave `other` empty. */
  Topo(Topo&& other) noexcept : topo_(std::exchange(other.topo_, nullptr)) {}
  /* Frees the topology held so far, then takes `other`'s. */
  Topo& operator=(Topo&& other) noexcept {
    if (this != &other) {
      mpg_topo_destroy(topo_);
      topo_ = std::exchange(other.topo_, nullptr);
    }
    return *this;
  }

  /* The C handle (still owned). */
  mpg_topo* get() const noexcept { return topo_; }
  /* Give up ownership: the caller must mpg_topo_destroy the result. */
  mpg_topo* release() noexcept { return std::exchange(topo_, nullptr); }
  /* True when it holds a topology. */
  explicit operator bool() const noexcept { return topo_ != nullptr; }

  /* Where it came from: "this machine (HOST)", the XML path, ... */
  std::string source() const { return mpg_topo_source(topo_); }
  /* True for this machine's own topology (binding can be applied). */
  bool is_this_system() const noexcept { return mpg_topo_is_this_system(topo_) != 0; }
  /* Number of GPUs. */
  int num_gpus() const noexcept { return mpg_topo_num_gpus(topo_); }
  /* Number of NUMA nodes. */
  int num_numa_nodes() const noexcept { return mpg_topo_num_numa_nodes(topo_); }
  /* Number of packages (sockets). */
  int num_packages() const noexcept { return mpg_topo_num_packages(topo_); }
  /* Number of cores. */
  int num_cores() const noexcept { return mpg_topo_num_cores(topo_); }
  /* Number of PUs (hardware threads). */
  int num_pus() const noexcept { return mpg_topo_num_pus(topo_); }
  /* Number of NICs, GPU-attached or not. */
  int num_nics() const noexcept { return mpg_topo_num_nics(topo_); }
  /* True when every pair of GPUs is linked by NVLink. */
  bool has_gpu_fabric() const noexcept { return mpg_topo_has_gpu_fabric(topo_) != 0; }
  /* GPU `gpu` (mpg_topo_get_gpu).  Throws ERR_RANGE. */
  mpg_gpu_info gpu(int gpu) const {
    mpg_gpu_info info = MPG_GPU_INFO_INIT;
    check(mpg_topo_get_gpu(topo_, gpu, &info));
    return info;
  }
  /* The k-th nearest NIC of GPU `gpu` (mpg_topo_get_gpu_nic).  Throws
   * ERR_RANGE. */
  mpg_nic_info gpu_nic(int gpu, int k) const {
    mpg_nic_info info = MPG_NIC_INFO_INIT;
    check(mpg_topo_get_gpu_nic(topo_, gpu, k, &info));
    return info;
  }
  /* Every nearest NIC of GPU `gpu`, nearest first.  Throws ERR_RANGE. */
  std::vector<mpg_nic_info> gpu_nics(int gpu) const {
    std::vector<mpg_nic_info> v;
    for (int k = 0, n = this->gpu(gpu).num_nics; k < n; k++) v.push_back(gpu_nic(gpu, k));
    return v;
  }
  /* NIC `nic` (mpg_topo_get_nic).  Throws ERR_RANGE. */
  mpg_nic_info nic(int nic) const {
    mpg_nic_info info = MPG_NIC_INFO_INIT;
    check(mpg_topo_get_nic(topo_, nic, &info));
    return info;
  }
  /* Choose GPU and CPUs of a local rank and bind them as `apply` says
   * (mpg_topo_bind). */
  mpg_binding bind(int local_rank, int local_world, int gpu, mpg_bind mode,
                   mpg_bind_apply apply) const {
    mpg_binding b = MPG_BINDING_INIT;
    check(mpg_topo_bind(topo_, local_rank, local_world, gpu, mode, apply, &b));
    return b;
  }

 private:
  mpg_topo* topo_ = nullptr;
};

/* Where one mesh rank runs (mpg_placement_of). */
struct Slot {
  int launcher_rank; /* the RANK the launcher gave it */
  int node;          /* its node */
  int gpu;           /* its GPU (local rank on the node) */
};

/* Owner of an mpg_placement (which launcher rank takes which mesh rank).
 * Move-only.  The Mesh it was made from must outlive it. */
class Placement {
 public:
  /* An empty owner. */
  Placement() noexcept = default;
  /* Place the ranks of `mesh` (mpg_placement_create).  Throws ERR_TOPO,
   * ERR_RANGE, ERR_NOT_FOUND, ERR_INVALID. */
  Placement(const Mesh& mesh, const mpg_placement_opts& opts) {
    check(mpg_placement_create(mesh.get(), &opts, &placement_));
  }
  /* The same with MPG_PLACEMENT_OPTS_INIT (one node). */
  explicit Placement(const Mesh& mesh) {
    check(mpg_placement_create(mesh.get(), nullptr, &placement_));
  }
  /* Take ownership of a C placement (may be nullptr). */
  explicit Placement(mpg_placement* placement) noexcept : placement_(placement) {}
  /* Frees the placement (mpg_placement_destroy). */
  ~Placement() { mpg_placement_destroy(placement_); }
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;
  /* Moves leave `other` empty. */
  Placement(Placement&& other) noexcept
      : placement_(std::exchange(other.placement_, nullptr)) {}
  /* Frees the placement held so far, then takes `other`'s. */
  Placement& operator=(Placement&& other) noexcept {
    if (this != &other) {
      mpg_placement_destroy(placement_);
      placement_ = std::exchange(other.placement_, nullptr);
    }
    return *this;
  }

  /* The C handle (still owned). */
  mpg_placement* get() const noexcept { return placement_; }
  /* Give up ownership: the caller must mpg_placement_destroy the result. */
  mpg_placement* release() noexcept { return std::exchange(placement_, nullptr); }
  /* True when it holds a placement. */
  explicit operator bool() const noexcept { return placement_ != nullptr; }

  /* Node count. */
  int num_nodes() const noexcept { return mpg_placement_num_nodes(placement_); }
  /* Where mesh rank `mesh_rank` runs.  Throws ERR_RANGE. */
  Slot of(int mesh_rank) const {
    Slot s{-1, -1, -1};
    check(mpg_placement_of(placement_, mesh_rank, &s.launcher_rank, &s.node, &s.gpu));
    return s;
  }
  /* The mesh rank that launcher rank `launcher_rank` takes.  Throws ERR_RANGE. */
  int mesh_rank(int launcher_rank) const {
    int m = -1;
    check(mpg_placement_mesh_rank(placement_, launcher_rank, &m));
    return m;
  }
  /* Nodes spanned by group `group_index` of `dimset`. */
  int group_nodes(int dimset, int group_index) const {
    int n = 0;
    check(mpg_placement_group_nodes(placement_, dimset, group_index, &n));
    return n;
  }
  /* True when every dim of `dimset` is kept inside a node. */
  bool dimset_is_inner(int dimset) const noexcept {
    return mpg_placement_dimset_is_inner(placement_, dimset) != 0;
  }
  /* Count inner groups that cross nodes (mpg_placement_check).  With
   * strict, misfits throw ERR_TOPO instead. */
  int check_misfits(bool strict = false) const {
    int misfits = 0;
    check(mpg_placement_check(placement_, strict ? 1 : 0, &misfits));
    return misfits;
  }

 private:
  mpg_placement* placement_ = nullptr;
};

/* ------------------------------------------------------------------------ */
/* Launch environment and hosts                                              */
/* ------------------------------------------------------------------------ */

/* The library's version (mpg_version_string), e.g. "1.1.0", and whether it
 * has the major.minor of this header (mpg_version() against
 * MPG_VERSION_HEX): before 1.0 a minor release may change the ABI. */
inline std::string version() { return mpg_version_string(); }
inline bool library_matches_header() noexcept {
  return (mpg_version() >> 8) == (MPG_VERSION_HEX >> 8);
}

/* What the launcher said (mpg_launch_from_env).  Throws ERR_ENV naming a
 * malformed or contradictory variable. */
inline mpg_launch launch_from_env() {
  mpg_launch l = MPG_LAUNCH_INIT;
  check(mpg_launch_from_env(&l));
  return l;
}

/* This machine's identity, "HOSTNAME:BOOT_ID" (mpg_topo_host_identity). */
inline std::string host_identity() {
  char buf[MPG_HOST_ID_MAX];
  check(mpg_topo_host_identity(buf, sizeof buf));
  return buf;
}

/* Node numbering computed by node_ids. */
struct NodeIds {
  std::vector<int> node_of;    /* launcher rank -> node */
  std::vector<int> local_rank; /* launcher rank -> position on its node */
  int num_nodes = 0;           /* how many nodes */
};

/* Number the nodes from one host identity per rank (mpg_topo_node_ids). */
inline NodeIds node_ids(const std::vector<std::string>& host_ids) {
  std::vector<const char*> ids;
  for (const std::string& h : host_ids) ids.push_back(h.c_str());
  NodeIds out;
  out.node_of.resize(host_ids.size());
  out.local_rank.resize(host_ids.size());
  check(mpg_topo_node_ids(static_cast<int>(host_ids.size()), ids.data(), out.node_of.data(),
                     out.local_rank.data(), &out.num_nodes));
  return out;
}

/* ------------------------------------------------------------------------ */
/* Simulated ranks                                                           */
/* ------------------------------------------------------------------------ */

/* The outcome of run_threads. */
struct ThreadRun {
  mpg_status status = MPG_OK;        /* MPG_OK, or the first failure's status */
  int failed_rank = -1;              /* the rank that failed first; -1 if none
                                        (or mpg_thread_run itself failed) */
  std::string message;               /* the first failure's message, "" if none */
  std::vector<mpg_status> statuses;  /* each rank's status */
  std::vector<std::string> messages; /* each rank's message ("" for MPG_OK) */
  /* True when every rank returned normally. */
  bool ok() const noexcept { return status == MPG_OK; }
};

/* Run `nranks` simulated ranks as threads of this process
 * (mpg_thread_run), each calling body(opts) with init options filled for
 * its rank (thread backend, rank, world size, timeout_s).  A rank that
 * returns has status MPG_OK.  A rank that throws gets a status: an Error
 * its own status, std::bad_alloc MPG_ERR_NOMEM, anything else
 * MPG_ERR_STATE; and its message: what() ("unknown exception" for a
 * non-std exception).  Nothing thrown in a rank escapes it.
 * Never throws for a rank's failure: check ThreadRun::ok().  When
 * mpg_thread_run itself fails (nranks outside 1..4096, timeout_s <= 0,
 * threads that cannot start), status and message are its error. */
inline ThreadRun run_threads(int nranks, double timeout_s,
                             const std::function<void(const mpg_init_opts&)>& body) {
  struct State {
    const std::function<void(const mpg_init_opts&)>* body;
    std::mutex mu;
    ThreadRun run;
  } state;
  state.body = &body;
  if (nranks > 0) {
    state.run.statuses.assign(static_cast<std::size_t>(nranks), MPG_OK);
    state.run.messages.assign(static_cast<std::size_t>(nranks), std::string());
  }
  mpg_rank_main trampoline = [](const mpg_init_opts* opts, void* arg) -> mpg_status {
    State* s = static_cast<State*>(arg);
    mpg_status st = MPG_OK;
    std::string msg;
    try {
      (*s->body)(*opts);
      return MPG_OK;
    } catch (const Error& e) {
      st = e.status();
      msg = e.what();
    } catch (const std::bad_alloc& e) {
      st = MPG_ERR_NOMEM;
      msg = e.what();
    } catch (const std::exception& e) {
      st = MPG_ERR_STATE;
      msg = e.what();
    } catch (...) {
      st = MPG_ERR_STATE;
      msg = "unknown exception";
    }
    try {
      std::lock_guard<std::mutex> lock(s->mu);
      std::size_t r = static_cast<std::size_t>(opts->rank);
      s->run.messages[r] = msg;
      if (s->run.failed_rank < 0) {
        s->run.failed_rank = opts->rank;
        s->run.status = st;
        s->run.message = msg;
      }
    } catch (...) {
      /* Out of memory for the message: the status still tells. */
    }
    return st;
  };
  std::vector<mpg_status> statuses(static_cast<std::size_t>(nranks > 0 ? nranks : 0));
  mpg_status st = mpg_thread_run(nranks, timeout_s, trampoline, &state,
                                 statuses.empty() ? nullptr : statuses.data());
  ThreadRun run = std::move(state.run);
  if (st != MPG_OK) {
    run.statuses = statuses;
    if (run.failed_rank < 0) {
      run.status = st;
      run.message = mpg_last_error();
    }
  }
  return run;
}

}  // namespace meshpg

#endif /* MESHPG_HPP */
