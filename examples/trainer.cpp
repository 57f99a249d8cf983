/*
 * trainer.cpp - a Megatron-style training loop on meshpg.hpp.
 *
 * This is documentation by example: the shape of a 3D-parallel trainer
 * written against the C++ layer, with the model replaced by gradients that
 * are known in advance, so that every rank can check the synchronisation.
 *
 *   trainer [SPEC] [--threads N] [--backend thread|mpi] [--mesh DIMS]
 *           [--params FILE] [--steps K] [--microbatches M] [--timeout S]
 *
 *   trainer                                   8 simulated ranks, examples/seed.toml
 *   trainer examples/pp4d.toml --threads 16
 *   mpirun -np 4 trainer my.toml --backend mpi
 *
 * What each rank does:
 *  1. joins the world and builds its groups from the mesh: tp, cp, dp and
 *     the data-parallel group (dp_cp: the ranks holding the same model
 *     shard but seeing different data);
 *  2. registers the parameters of a transformer shard with a Sync: weights
 *     reduce over the data-parallel group, norms (sequence parallel) also
 *     over tp;
 *  3. for K steps of M micro-batches: a "forward" that uses the tp and cp
 *     groups the way Megatron does, then a "backward" that writes each
 *     gradient (a function of the rank's coordinates, the step and the
 *     micro-batch), last parameter first, and marks it ready so that its
 *     bucket can be reduced while the rest of backward runs;
 *  4. after the last micro-batch, checks every gradient element against the
 *     average it computes itself from the coordinates of its replicas, and
 *     rank 0 prints one line per step.  "OK" at the end, else exit 1.
 *
 * The trainer fills gradients on the host, so it runs on the thread and MPI
 * backends; the spec's [backend] name is not used, its timeout_s is.
 * Exit codes: 0 OK, 1 a failed check or an error, 2 a usage error.
 */
#include <meshpg.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef MESHPG_SOURCE_ROOT
#define MESHPG_SOURCE_ROOT "."
#endif

namespace {

/* ------------------------------------------------------------------------ */
/* Command line                                                              */
/* ------------------------------------------------------------------------ */

struct Options {
  std::string spec = MESHPG_SOURCE_ROOT "/examples/seed.toml";
  int threads = 0;       // 0: the mesh size
  std::string backend;   // "": thread with --threads, else mpi under mpirun
  std::string mesh;      // "": the spec's dims
  std::string params;    // "": the built-in list
  int steps = 3;
  int microbatches = 2;
  double timeout = 0;    // 0: the spec's [backend] timeout_s
};

const char kUsage[] =
    "usage: trainer [SPEC] [options]\n"
    "  SPEC               TOML mesh spec (default: examples/seed.toml of the source tree)\n"
    "  --threads N        run N simulated ranks as threads (thread backend;\n"
    "                     default: the mesh size)\n"
    "  --backend B        thread | mpi (default: thread with --threads, else\n"
    "                     mpi under mpirun or srun, else thread)\n"
    "  --mesh DIMS        replace the spec's dims, e.g. dp=-1,cp=2,tp=2\n"
    "  --params FILE      parameter list, one 'name elements shape' a line,\n"
    "                     '#' comments (default: a built-in 2-layer model)\n"
    "  --steps K          training steps (default 3)\n"
    "  --microbatches M   micro-batches per step (default 2)\n"
    "  --timeout S        collective timeout in seconds (default: the spec's)\n"
    "  -h, --help         this text\n";

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "trainer: %s\n%s", msg.c_str(), kUsage);
  return 2;
}

bool parse_int(const char* s, int min, int* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end || v < min || v > 1000000) return false;
  *out = static_cast<int>(v);
  return true;
}

/* Returns -1 to go on, else the exit code. */
int parse_args(int argc, char** argv, Options& o) {
  bool have_spec = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--threads" || a == "--steps" || a == "--microbatches") {
      const char* v = value();
      int* dst = a == "--threads" ? &o.threads : a == "--steps" ? &o.steps : &o.microbatches;
      if (!v || !parse_int(v, 1, dst)) return usage_error(a + ": expected a positive integer");
    } else if (a == "--timeout") {
      const char* v = value();
      char* end = nullptr;
      o.timeout = v ? std::strtod(v, &end) : 0;
      if (!v || *end || !(o.timeout > 0)) return usage_error(a + ": expected seconds > 0");
    } else if (a == "--backend" || a == "--mesh" || a == "--params") {
      const char* v = value();
      if (!v) return usage_error(a + ": missing value");
      (a == "--backend" ? o.backend : a == "--mesh" ? o.mesh : o.params) = v;
    } else if (!a.empty() && a[0] == '-') {
      return usage_error("unknown option " + a);
    } else if (have_spec) {
      return usage_error("more than one spec file: " + a);
    } else {
      o.spec = a;
      have_spec = true;
    }
  }
  if (!o.backend.empty() && o.backend != "thread" && o.backend != "mpi")
    return usage_error("--backend " + o.backend + ": expected thread or mpi");
  if (o.backend == "mpi" && o.threads > 0)
    return usage_error("--threads runs simulated ranks: it needs --backend thread");
  return -1;
}

/* ------------------------------------------------------------------------ */
/* Parameters                                                                */
/* ------------------------------------------------------------------------ */

struct Param {
  std::string name;   // "l0.qkv"
  std::size_t count;  // elements of this rank's shard
  std::string shape;  // "192x64", for display
  bool is_norm() const { return name.find("norm") != std::string::npos; }
};

/* A 2-layer transformer shard: hidden 64, ffn 256, vocab 1024. */
const char kBuiltinParams[] =
    "# name      elements  shape\n"
    "embed       65536     1024x64\n"
    "l0.norm1    64        64\n"
    "l0.qkv      12288     192x64\n"
    "l0.proj     4096      64x64\n"
    "l0.norm2    64        64\n"
    "l0.fc1      16384     256x64\n"
    "l0.fc2      16384     64x256\n"
    "l1.norm1    64        64\n"
    "l1.qkv      12288     192x64\n"
    "l1.proj     4096      64x64\n"
    "l1.norm2    64        64\n"
    "l1.fc1      16384     256x64\n"
    "l1.fc2      16384     64x256\n"
    "final_norm  64        64\n";

/* Read "name elements shape" lines ('#' starts a comment; shape is
 * optional and, when given as AxBx..., must multiply to elements). */
std::vector<Param> parse_params(std::istream& in, const std::string& source) {
  std::vector<Param> params;
  std::string line;
  for (int lineno = 1; std::getline(in, line); lineno++) {
    line = line.substr(0, line.find('#'));
    std::istringstream fields(line);
    std::string name, elements, shape, extra;
    if (!(fields >> name)) continue;  // blank or comment
    fields >> elements >> shape >> extra;
    auto fail = [&](const std::string& what) {
      throw std::runtime_error(source + ":" + std::to_string(lineno) + ": " + what);
    };
    char* end = nullptr;
    unsigned long long n = std::strtoull(elements.c_str(), &end, 10);
    if (elements.empty() || *end || n == 0 || elements[0] == '-')
      fail("param \"" + name + "\": expected 'name elements shape' with elements > 0, found \"" +
           elements + "\"");
    if (!extra.empty()) fail("param \"" + name + "\": unexpected \"" + extra + "\"");
    if (!shape.empty()) {
      unsigned long long prod = 1;
      std::istringstream dims(shape);
      std::string d;
      while (std::getline(dims, d, 'x')) prod *= std::strtoull(d.c_str(), nullptr, 10);
      if (prod != n)
        fail("param \"" + name + "\": shape " + shape + " has " + std::to_string(prod) +
             " elements, not " + elements);
    }
    for (const Param& p : params)
      if (p.name == name) fail("param \"" + name + "\" is listed twice");
    params.push_back(Param{name, static_cast<std::size_t>(n), shape});
  }
  if (params.empty()) throw std::runtime_error(source + ": no parameters");
  return params;
}

std::vector<Param> load_params(const std::string& path) {
  if (path.empty()) {
    std::istringstream in(kBuiltinParams);
    return parse_params(in, "<built-in>");
  }
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  return parse_params(in, path);
}

/* ------------------------------------------------------------------------ */
/* The synthetic model                                                       */
/* ------------------------------------------------------------------------ */

/* A number for a rank's coordinates: its data shard and model shard. */
long shard_of(const std::vector<int>& coord) {
  long id = 0;
  for (int c : coord) id = id * 7 + c;
  return id;
}

/* The gradient a rank computes for element i of parameter p in one
 * micro-batch: a small integer, so that sums are exact in f32. */
float grad_value(int p, std::size_t i, long step, int mb, long shard) {
  long v = static_cast<long>(i % 61) * 7 + p * 13 + step * 5 + mb * 3 + shard * 11;
  return static_cast<float>(v % 61 - 30);
}

/* The loss of a data shard (its position in the data-parallel group). */
double local_loss(long step, int mb, int data_pos) {
  return 4.0 / static_cast<double>(1 + step) + 0.01 * mb + 0.001 * data_pos;
}

/* The mesh dims over which a gradient is averaged by default, as meshpg.h
 * states it for mpg_sync_create: cp with fsdp_owns_dp; else the dims of the
 * flattened set dp_cp; else whichever of dp and cp the mesh has. */
std::vector<int> data_parallel_dims(const meshpg::Mesh& mesh, const mpg_sync_opts& so) {
  if (so.sync.fsdp_owns_dp)
    return mesh.has("cp") ? mesh.dimset_dims(mesh.dimset("cp")) : std::vector<int>{};
  if (mesh.has("dp_cp")) return mesh.dimset_dims(mesh.dimset("dp_cp"));
  std::vector<int> dims;
  for (const char* name : {"dp", "cp"})
    if (mesh.has(name)) dims.push_back(mesh.dimset_dims(mesh.dimset(name))[0]);
  std::sort(dims.begin(), dims.end());
  return dims;
}

/* "dp,cp,tp": names for Ctx::group_dims and reduce_dims. */
std::string dim_names(const meshpg::Mesh& mesh, const std::vector<int>& dims) {
  std::string s;
  for (int d : dims) s += (s.empty() ? "" : ",") + mesh.dim(d).name;
  return s;
}

/* The shard ids of the ranks that share my coordinates outside `dims`:
 * the replicas whose gradients are reduced together. */
std::vector<long> replica_shards(const meshpg::Mesh& mesh, const std::vector<int>& me,
                                 const std::vector<int>& dims) {
  std::vector<long> shards;
  for (int r = 0; r < mesh.world_size(); r++) {
    std::vector<int> c = mesh.coord_of(r);
    bool same = true;
    for (int d = 0; d < mesh.ndims(); d++)
      if (c[d] != me[d] && std::find(dims.begin(), dims.end(), d) == dims.end()) same = false;
    if (same) shards.push_back(shard_of(c));
  }
  return shards;
}

/* ------------------------------------------------------------------------ */
/* One rank                                                                  */
/* ------------------------------------------------------------------------ */

struct Job {
  const meshpg::Spec& spec;
  const meshpg::Mesh& mesh;
  const std::vector<Param>& params;
  const Options& opt;
};

/* A failed check: the rank throws (and the trainer exits 1). */
void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

/* A group of the mesh, or an empty Group (a group of one) when the mesh
 * has no such dim. */
meshpg::Group optional_group(meshpg::Ctx& ctx, const meshpg::Mesh& mesh, const char* name) {
  return mesh.has(name) ? ctx.group(name) : meshpg::Group();
}
int pos_in(const meshpg::Group& g) { return g ? g.position() : 0; }
int size_of(const meshpg::Group& g) { return g ? g.size() : 1; }

/* Forward of one micro-batch: the collectives Megatron's layers make over
 * tp and cp (each checked), and this rank's loss. */
double forward(meshpg::Group& tp, meshpg::Group& cp, long step, int mb, int data_pos) {
  // Tensor parallel: a row-parallel linear layer sums its partial outputs.
  std::vector<float> out(8, static_cast<float>(pos_in(tp) + 1));
  if (tp) tp.all_reduce(out, MPG_OP_SUM);
  const int t = size_of(tp);
  require(out[0] == static_cast<float>(t * (t + 1) / 2), "all_reduce over tp");

  // Context parallel: each rank holds one chunk of the sequence, and
  // attention needs every chunk's first token.
  const std::int32_t chunk = 512;
  std::vector<std::int32_t> first{pos_in(cp) * chunk};
  if (cp) first = cp.all_gather(first);
  for (std::size_t j = 0; j < first.size(); j++)
    require(first[j] == static_cast<std::int32_t>(j) * chunk, "all_gather over cp");

  return local_loss(step, mb, data_pos);
}

/* Backward of one micro-batch: gradients appear last parameter first.
 * Each is accumulated into its view, then marked ready: on the last
 * micro-batch a bucket whose gradients are all ready is reduced at once,
 * in the background, while backward goes on. */
void backward(meshpg::Sync& sync, const std::vector<Param>& params, const std::vector<int>& ids,
              long shard, long step, int mb) {
  for (std::size_t k = params.size(); k-- > 0;) {
    float* g = sync.grad<float>(ids[k]);
    for (std::size_t i = 0; i < params[k].count; i++)
      g[i] += grad_value(static_cast<int>(k), i, step, mb, shard);
    sync.mark_ready(ids[k]);
  }
}

/* Instead of an optimizer step: count the gradient elements that differ
 * from grad_scale x the average (or sum) over their replicas, computed here
 * from the replicas' coordinates.  *max_err gets the largest difference. */
long count_wrong_grads(meshpg::Sync& sync, const std::vector<Param>& params,
                       const std::vector<int>& ids, const std::vector<long>& weight_replicas,
                       const std::vector<long>& norm_replicas, const mpg_sync_opts& so,
                       long step, int microbatches, double* max_err) {
  long bad = 0;
  for (std::size_t k = 0; k < params.size(); k++) {
    const std::vector<long>& replicas = params[k].is_norm() ? norm_replicas : weight_replicas;
    require(sync.param_group(ids[k]).size() == static_cast<int>(replicas.size()),
            "param " + params[k].name + ": size of its reduce group");
    const double n = static_cast<double>(replicas.size());
    const double scale = so.grad_scale / (so.sync.op == MPG_OP_AVG ? n : 1.0);
    const float* g = sync.grad<float>(ids[k]);
    for (std::size_t i = 0; i < params[k].count; i++) {
      double sum = 0;
      for (long shard : replicas)
        for (int mb = 0; mb < microbatches; mb++)
          sum += grad_value(static_cast<int>(k), i, step, mb, shard);
      const double err = std::fabs(g[i] - scale * sum);
      *max_err = std::max(*max_err, err);
      if (err > 1e-5 * std::max(1.0, std::fabs(scale * sum))) bad++;
    }
  }
  return bad;
}

/* One rank of the job, from joining the world to the last step. */
void train(const Job& job, const mpg_init_opts& init) {
  const meshpg::Mesh& mesh = job.mesh;
  const int M = job.opt.microbatches;

  // 1. Join the world; this rank's groups of the mesh.
  meshpg::Ctx ctx(mesh, init);
  const int rank = ctx.rank();
  const bool leader = rank == 0;
  const std::vector<int> me = mesh.coord_of(rank);
  meshpg::Group world = ctx.group("world");
  meshpg::Group tp = optional_group(ctx, mesh, "tp");
  meshpg::Group cp = optional_group(ctx, mesh, "cp");
  meshpg::Group dp = optional_group(ctx, mesh, "dp");

  // 2. Gradient synchronisation: the [sync] section of the spec, with the
  // loss averaged over micro-batches.  Weights reduce over the
  // data-parallel dims; norms (sequence parallel) over tp as well.
  mpg_sync_opts so = job.spec.sync_opts();
  so.grad_scale = 1.0 / M;
  meshpg::Sync sync(ctx, so);
  const std::vector<int> data_dims = data_parallel_dims(mesh, so);
  std::vector<int> norm_dims = data_dims;
  if (mesh.has("tp")) norm_dims.push_back(mesh.dimset_dims(mesh.dimset("tp"))[0]);
  std::sort(norm_dims.begin(), norm_dims.end());
  const std::string norm_reduce = dim_names(mesh, norm_dims);
  const mpg_param_opts norm_opts = meshpg::param_opts(norm_reduce.c_str());
  std::vector<int> ids;
  for (const Param& p : job.params)
    ids.push_back(sync.add_param<float>(p.name, p.count, p.is_norm() ? &norm_opts : nullptr));
  sync.commit();

  // The data-parallel group (empty when the mesh has none): the loss is
  // averaged over it, like the weights' gradients.
  meshpg::Group data = data_dims.empty() ? meshpg::Group()
                                         : ctx.group_dims(dim_names(mesh, data_dims));
  const std::vector<long> weight_replicas = replica_shards(mesh, me, data_dims);
  const std::vector<long> norm_replicas = replica_shards(mesh, me, norm_dims);
  require(size_of(data) == static_cast<int>(weight_replicas.size()),
          "the data-parallel group has " + std::to_string(size_of(data)) + " ranks");

  // Every data-parallel replica starts from the same weights: broadcast
  // the initialisation seed from dp position 0.
  std::int64_t seed = 1000 + rank;
  if (dp) dp.broadcast(&seed, 1, 0);
  require(seed == 1000 + (dp ? dp.member(0) : rank), "broadcast over dp");

  if (leader) {
    std::size_t elements = 0;
    for (const Param& p : job.params) elements += p.count;
    std::string dims;
    for (const meshpg::Dim& d : mesh.dims())
      dims += (dims.empty() ? "" : ",") + d.name + "=" + std::to_string(d.size);
    std::printf("trainer: mesh %s on %d ranks (%s backend), %zu params (%zu floats per rank), "
                "%d steps x %d micro-batches, gradients over %s\n",
                dims.c_str(), ctx.world_size(),
                ctx.backend() == MPG_BACKEND_MPI ? "mpi" : "thread", job.params.size(),
                elements, job.opt.steps, M,
                data_dims.empty() ? "(nothing)" : dim_names(mesh, data_dims).c_str());
    std::fflush(stdout);
  }

  // 3. The training loop.
  for (long step = 0; step < job.opt.steps; step++) {
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    meshpg::Work loss_work;
    for (int mb = 0; mb < M; mb++) {
      const bool last = mb == M - 1;
      loss += forward(tp, cp, step, mb, pos_in(data)) / M;
      // The step's loss is averaged over the data-parallel replicas while
      // the last backward runs.
      if (last && data) loss_work = data.all_reduce_async(&loss, &loss, 1, MPG_OP_AVG);
      sync.begin(step, last);
      backward(sync, job.params, ids, shard_of(me), step, mb);
      sync.finish();  // last micro-batch: every gradient is reduced
    }
    loss_work.wait();

    // 4. Check: every rank's gradients, and the loss.
    double max_err = 0;
    long bad = count_wrong_grads(sync, job.params, ids, weight_replicas, norm_replicas, so, step,
                                 M, &max_err);
    double want_loss = 0;
    for (int pos = 0; pos < size_of(data); pos++)
      for (int mb = 0; mb < M; mb++) want_loss += local_loss(step, mb, pos) / M;
    if (std::fabs(loss - want_loss / size_of(data)) > 1e-9) bad++;

    // Every rank's verdict, for everyone.
    const std::int64_t bad_total = world.all_reduce_value<std::int64_t>(bad, MPG_OP_SUM);
    max_err = world.all_reduce_value(max_err, MPG_OP_MAX);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (leader) {
      const mpg_sync_stats st = sync.stats();
      std::printf("step %ld/%d  loss %.4f  grads %s on %d ranks  max err %.2g  "
                  "(%d buckets, %zu KiB, %.1f ms)\n",
                  step + 1, job.opt.steps, loss, bad_total ? "WRONG" : "ok", ctx.world_size(),
                  max_err, st.num_buckets, st.total_bytes / 1024, ms);
      std::fflush(stdout);
    }
    require(bad_total == 0, std::to_string(bad_total) + " wrong values at step " +
                                std::to_string(step + 1) + (bad ? " (some here)" : ""));
    sync.zero_grads();  // after the optimizer step
  }
  world.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  const int rc = parse_args(argc, argv, opt);
  if (rc >= 0) return rc;

  try {
    meshpg::Spec spec = meshpg::Spec::load_file(opt.spec);
    if (!opt.mesh.empty()) spec.set_mesh(opt.mesh).validate();
    const std::vector<Param> params = load_params(opt.params);
    const double timeout = opt.timeout > 0 ? opt.timeout : spec->backend.timeout_s;

    // Under mpirun or srun one process runs each rank: the MPI backend.
    const mpg_launch launch = meshpg::launch_from_env();
    const bool launched = launch.world_size > 0;
    const bool mpi_launcher = launched && std::strcmp(launch.source, "torchrun") != 0;
    std::string backend = opt.backend;
    if (backend.empty()) backend = opt.threads == 0 && mpi_launcher ? "mpi" : "thread";

    if (backend == "mpi") {
      // One process per rank: the world comes from the launcher.
      if (!launched) {
        std::fprintf(stderr, "trainer: --backend mpi: no launcher environment; run under "
                             "mpirun -np N\n");
        return 1;
      }
      meshpg::Mesh mesh(spec, launch.world_size);
      mpg_init_opts init = MPG_INIT_OPTS_INIT;
      init.backend.name = MPG_BACKEND_MPI;
      init.backend.timeout_s = timeout;
      try {
        train(Job{spec, mesh, params, opt}, init);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "trainer: rank %d: %s\n", launch.rank, e.what());
        return 1;
      }
      if (launch.rank == 0) std::puts("OK");
      return 0;
    }

    // Simulated ranks: N threads of this process share one (immutable) mesh.
    int n = opt.threads;
    if (n == 0) {
      n = 1;
      for (int d = 0; d < spec->ndims; d++) n *= spec->dims[d].size;
      if (n <= 0)
        return usage_error("the spec infers a dim (size -1): give the world size with --threads N");
    }
    meshpg::Mesh mesh(spec, n);
    const Job job{spec, mesh, params, opt};
    const meshpg::ThreadRun run =
        meshpg::run_threads(n, timeout, [&job](const mpg_init_opts& init) { train(job, init); });
    if (!run.ok()) {
      std::fprintf(stderr, "trainer: rank %d failed: %s\n", run.failed_rank, run.message.c_str());
      return 1;
    }
    std::puts("OK");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer: %s\n", e.what());
    return 1;
  }
}
