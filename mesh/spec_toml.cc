// The TOML reader: the one C++17 file of the library, because toml++ is a
// C++ library.  It fills an mpg_spec, remembers where each value came from,
// and turns every problem into an mpg_status with file:line:col, the key
// path, what was expected and what was found.  No exception leaves it.
#include <toml++/toml.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "spec_internal.h"

namespace {

struct failure {
  mpg_status status;
};

struct reader {
  mpg_spec *spec;
  mpg_srcpos opt_pos[MPG__OPT_COUNT] = {};

  static mpg_srcpos pos(const toml::source_region &r) {
    return mpg_srcpos{static_cast<int>(r.begin.line),
                      static_cast<int>(r.begin.column)};
  }

  [[noreturn]] void fail(const toml::source_region &r, const std::string &msg,
                         mpg_status st = MPG_ERR_SPEC) {
    mpg__fail_at(st, spec->source, pos(r), "%s", msg.c_str());
    throw failure{st};
  }

  static std::string describe(const toml::node &n) {
    std::ostringstream o;
    if (auto s = n.as_string())
      o << "string \"" << s->get() << "\"";
    else if (auto i = n.as_integer())
      o << "integer " << i->get();
    else if (auto f = n.as_floating_point()) {
      double v = f->get();
      o << "float " << v;
      if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) o << ".0";
    }
    else if (auto b = n.as_boolean())
      o << "boolean " << (b->get() ? "true" : "false");
    else if (n.is_array())
      o << "an array";
    else if (n.is_table())
      o << "a table";
    else
      o << "a date or time";
    return o.str();
  }

  [[noreturn]] void expected(const std::string &path, const toml::node &n,
                             const char *what) {
    fail(n.source(), path + ": expected " + what + ", found " + describe(n));
  }

  // Every key of `t` must be one of `keys`; a near miss gets a suggestion.
  // The keys of a table in file order (toml++ iterates sorted by name).
  static std::vector<std::pair<const toml::key *, const toml::node *>> in_order(
      const toml::table &t) {
    std::vector<std::pair<const toml::key *, const toml::node *>> v;
    for (auto &&[k, n] : t) v.emplace_back(&k, &n);
    std::stable_sort(v.begin(), v.end(), [](const auto &a, const auto &b) {
      const auto &pa = a.first->source().begin, &pb = b.first->source().begin;
      return pa.line != pb.line ? pa.line < pb.line : pa.column < pb.column;
    });
    return v;
  }

  void only_keys(const toml::table &t, const std::string &path,
                 std::vector<const char *> keys) {
    for (auto &&[kp, vp] : in_order(t)) {
      const toml::key &k = *kp;
      const toml::node &v = *vp;
      bool ok = false;
      for (auto key : keys) ok = ok || k.str() == key;
      if (ok) continue;
      std::string full = path.empty() ? std::string(k.str())
                                      : path + "." + std::string(k.str());
      std::string msg = full + ": unknown key";
      std::string kk(k.str());
      const char *near = mpg__closest(kk.c_str(), keys.data(),
                                      static_cast<int>(keys.size()));
      if (near) msg += std::string(" (did you mean \"") + near + "\"?)";
      msg += "; expected one of";
      for (size_t i = 0; i < keys.size(); i++)
        msg += std::string(i ? ", " : " ") + keys[i];
      (void)v;
      fail(k.source(), msg);
    }
  }

  const toml::table &section(const toml::node &n, const std::string &path) {
    if (!n.is_table()) expected(path, n, "a table");
    return *n.as_table();
  }

  bool get_bool(const toml::node &n, const std::string &path) {
    if (!n.is_boolean()) expected(path, n, "true or false");
    return n.as_boolean()->get();
  }

  double get_number(const toml::node &n, const std::string &path) {
    if (auto i = n.as_integer()) return static_cast<double>(i->get());
    if (auto f = n.as_floating_point()) return f->get();
    expected(path, n, "a number");
  }

  int get_int(const toml::node &n, const std::string &path, const char *what) {
    auto i = n.as_integer();
    if (!i) expected(path, n, what);
    int64_t v = i->get();
    if (v < -2147483647LL || v > 2147483647LL) expected(path, n, what);
    return static_cast<int>(v);
  }

  int get_choice(const toml::node &n, const std::string &path,
                 std::vector<const char *> names) {
    std::string what = "one of";
    for (size_t i = 0; i < names.size(); i++)
      what += std::string(i ? ", " : " ") + "\"" + names[i] + "\"";
    auto s = n.as_string();
    if (!s) expected(path, n, what.c_str());
    for (size_t i = 0; i < names.size(); i++)
      if (s->get() == names[i]) return static_cast<int>(i);
    std::string msg = path + ": expected " + what + ", found " + describe(n);
    const char *near = mpg__closest(s->get().c_str(), names.data(),
                                    static_cast<int>(names.size()));
    if (near) msg += std::string(" (did you mean \"") + near + "\"?)";
    fail(n.source(), msg);
  }

  void copy_name(char *dst, const toml::node &n, const std::string &path) {
    auto s = n.as_string();
    if (!s) expected(path, n, "a string");
    if (s->get().size() >= MPG_NAME_MAX)
      fail(n.source(), path + ": expected at most " +
                           std::to_string(MPG_NAME_MAX - 1) +
                           " chars, found \"" + s->get() + "\"");
    std::strcpy(dst, s->get().c_str());
  }

  /* A dims list such as "dp_shard,cp" (checked against the mesh when the
   * sync is created). */
  void copy_dims(char *dst, size_t cap, const toml::node &n, const std::string &path) {
    const char *what = "a list of dim names such as [\"dp_shard\", \"cp\"] or \"dp_shard,cp\"";
    std::string joined;
    if (auto s = n.as_string()) {
      joined = s->get();
    } else if (auto arr = n.as_array()) {
      for (size_t i = 0; i < arr->size(); i++) {
        auto e = (*arr)[i].as_string();
        if (!e || e->get().empty()) expected(path + "[" + std::to_string(i) + "]", (*arr)[i], "a dim name");
        joined += (i ? "," : "") + e->get();
      }
    } else {
      expected(path, n, what);
    }
    if (joined.empty() || joined.size() >= cap)
      fail(n.source(), path + ": expected 1 to " + std::to_string(cap - 1) +
                           " chars of dim names, found \"" + joined + "\"");
    std::strcpy(dst, joined.c_str());
  }

  void read_dims(const toml::node &n) {
    const std::string path = "mesh.dims";
    auto arr = n.as_array();
    if (!arr) expected(path, n, "an array of tables like { name = \"dp\", size = 2 }");
    if (arr->size() > MPG_MAX_DIMS)
      fail(arr->get(MPG_MAX_DIMS)->source(),
           path + ": expected at most " + std::to_string(MPG_MAX_DIMS) +
               " dims, found " + std::to_string(arr->size()));
    if (arr->empty()) fail(n.source(), path + ": expected 1 to 8 dims, found []");
    for (size_t i = 0; i < arr->size(); i++) {
      const toml::node &e = *arr->get(i);
      std::string ep = path + "[" + std::to_string(i) + "]";
      if (!e.is_table()) expected(ep, e, "a table like { name = \"dp\", size = 2 }");
      const toml::table &t = *e.as_table();
      only_keys(t, ep, {"name", "size"});
      mpg_dim &d = spec->dims[i];
      auto name = t.get("name");
      auto size = t.get("size");
      if (!name) fail(e.source(), ep + ": missing key \"name\"");
      if (!size) fail(e.source(), ep + ": missing key \"size\"");
      copy_name(d.name, *name, ep + ".name");
      d.name_pos = pos(name->source());
      d.size_pos = pos(size->source());
      if (auto s = size->as_string()) {
        if (s->get() != "auto")
          expected(ep + ".size", *size, "an integer, -1 or \"auto\"");
        d.size = -1;
      } else {
        d.size = get_int(*size, ep + ".size", "an integer, -1 or \"auto\"");
      }
    }
    spec->ndims = static_cast<int>(arr->size());
  }

  void read_flatten(const toml::node &n) {
    const toml::table &t = section(n, "mesh.flatten");
    int k = 0;
    for (auto &&[keyp, vp] : in_order(t)) {
      const toml::key &key = *keyp;
      const toml::node &v = *vp;
      std::string name(key.str());
      std::string fp = "mesh.flatten." + name;
      if (k == MPG_MAX_FLATTEN)
        fail(key.source(), "mesh.flatten: expected at most " +
                               std::to_string(MPG_MAX_FLATTEN) + " sets");
      mpg_flatten &f = spec->flatten[k];
      if (name.size() >= MPG_NAME_MAX)
        fail(key.source(), fp + ": the name is longer than " +
                               std::to_string(MPG_NAME_MAX - 1) + " chars");
      std::strcpy(f.name, name.c_str());
      f.name_pos = pos(key.source());
      auto arr = v.as_array();
      if (!arr) expected(fp, v, "a list of dim names like [\"dp\", \"cp\"]");
      if (arr->empty() || arr->size() > MPG_MAX_DIMS)
        fail(v.source(), fp + ": expected a list of 1 to " +
                             std::to_string(MPG_MAX_DIMS) + " dims, found " +
                             std::to_string(arr->size()));
      for (size_t i = 0; i < arr->size(); i++) {
        copy_name(f.dims[i], *arr->get(i),
                  fp + "[" + std::to_string(i) + "]");
        f.dim_pos[i] = pos(arr->get(i)->source());
      }
      f.ndims = static_cast<int>(arr->size());
      k++;
    }
    spec->nflatten = k;
  }

  void read_mesh(const toml::node &n) {
    const toml::table &t = section(n, "mesh");
    only_keys(t, "mesh", {"dims", "flatten", "order"});
    auto dims = t.get("dims");
    if (!dims) fail(n.source(), "mesh: missing key \"dims\"");
    read_dims(*dims);
    if (auto f = t.get("flatten")) read_flatten(*f);
    if (auto o = t.get("order")) {
      auto s = o->as_string();
      if (!s) expected("mesh.order", *o, "a Megatron order string like \"tp-cp-dp-pp\"");
      if (mpg_spec_apply_order(spec, s->get().c_str()) != MPG_OK) {
        std::string msg = std::string("mesh.") + mpg_last_error();
        fail(o->source(), msg);
      }
    }
  }

  void read_topology(const toml::node &n) {
    const toml::table &t = section(n, "topology");
    only_keys(t, "topology",
              {"nodes", "gpus_per_node", "bind", "rank_order", "strict"});
    if (auto v = t.get("nodes")) {
      spec->topology.nodes = get_int(*v, "topology.nodes", "an integer >= 0");
      opt_pos[MPG__OPT_NODES] = pos(v->source());
    }
    if (auto v = t.get("gpus_per_node")) {
      spec->topology.gpus_per_node = get_int(*v, "topology.gpus_per_node", "an integer >= 0");
      opt_pos[MPG__OPT_GPUS_PER_NODE] = pos(v->source());
    }
    if (auto v = t.get("bind"))
      spec->topology.bind = static_cast<mpg_bind>(
          get_choice(*v, "topology.bind", {"none", "numa", "core"}));
    if (auto v = t.get("rank_order"))
      spec->topology.rank_order = static_cast<mpg_rank_order>(
          get_choice(*v, "topology.rank_order", {"block", "cyclic"}));
    if (auto v = t.get("strict"))
      spec->topology.strict = get_bool(*v, "topology.strict");
  }

  void read_sync(const toml::node &n) {
    const toml::table &t = section(n, "sync");
    only_keys(t, "sync", {"fsdp_owns_dp", "op", "bucket_mb", "first_bucket_mb",
                          "reduce_dtype", "mode", "shard_dims", "replicate_dims",
                          "pad_for_nccl", "expert_shard_dims", "optimizer_instances"});
    if (auto v = t.get("mode")) {
      spec->sync.mode = static_cast<mpg_sync_mode>(
          get_choice(*v, "sync.mode", {"replicate", "shard"}));
      opt_pos[MPG__OPT_SYNC_MODE] = pos(v->source());
    }
    if (auto v = t.get("shard_dims"))
      copy_dims(spec->sync.shard_dims, sizeof spec->sync.shard_dims, *v, "sync.shard_dims");
    if (auto v = t.get("replicate_dims"))
      copy_dims(spec->sync.replicate_dims, sizeof spec->sync.replicate_dims, *v,
                "sync.replicate_dims");
    if (auto v = t.get("pad_for_nccl")) spec->sync.pad_for_nccl = get_bool(*v, "sync.pad_for_nccl");
    if (auto v = t.get("expert_shard_dims"))
      copy_dims(spec->sync.expert_shard_dims, sizeof spec->sync.expert_shard_dims, *v,
                "sync.expert_shard_dims");
    if (auto v = t.get("optimizer_instances")) {
      spec->sync.optimizer_instances =
          get_int(*v, "sync.optimizer_instances", "an integer >= 1");
      if (spec->sync.optimizer_instances < 1)
        fail(v->source(), "sync.optimizer_instances: expected an integer >= 1 (Megatron's "
                          "num_distributed_optimizer_instances), found " +
                              std::to_string(spec->sync.optimizer_instances));
    }
    if (auto v = t.get("fsdp_owns_dp")) {
      spec->sync.fsdp_owns_dp = get_bool(*v, "sync.fsdp_owns_dp");
      opt_pos[MPG__OPT_FSDP_OWNS_DP] = pos(v->source());
    }
    if (auto v = t.get("op"))
      spec->sync.op = get_choice(*v, "sync.op", {"avg", "sum"}) == 0 ? MPG_OP_AVG : MPG_OP_SUM;
    if (auto v = t.get("bucket_mb")) {
      spec->sync.bucket_mb = get_number(*v, "sync.bucket_mb");
      opt_pos[MPG__OPT_BUCKET_MB] = pos(v->source());
    }
    if (auto v = t.get("first_bucket_mb")) {
      spec->sync.first_bucket_mb = get_number(*v, "sync.first_bucket_mb");
      opt_pos[MPG__OPT_FIRST_BUCKET_MB] = pos(v->source());
    }
    if (auto v = t.get("reduce_dtype"))
      spec->sync.reduce_dtype = static_cast<mpg_reduce_dtype>(
          get_choice(*v, "sync.reduce_dtype", {"native", "f32"}));
  }

  void read_backend(const toml::node &n) {
    const toml::table &t = section(n, "backend");
    only_keys(t, "backend", {"name", "timeout_s", "lazy_groups"});
    if (auto v = t.get("name"))
      spec->backend.name = static_cast<mpg_backend_kind>(
          get_choice(*v, "backend.name", {"thread", "mpi", "nccl"}));
    if (auto v = t.get("timeout_s")) {
      spec->backend.timeout_s = get_number(*v, "backend.timeout_s");
      opt_pos[MPG__OPT_TIMEOUT_S] = pos(v->source());
    }
    if (auto v = t.get("lazy_groups"))
      spec->backend.lazy_groups = get_bool(*v, "backend.lazy_groups");
  }

  void read_experts(const toml::node &n) {
    const toml::table &t = section(n, "experts");
    only_keys(t, "experts", {"tp", "ep", "order"});
    spec->experts.pos = pos(n.source());
    spec->experts.ep = 1;
    if (auto v = t.get("ep")) {
      spec->experts.ep_pos = pos(v->source());
      if (auto s = v->as_string()) {
        if (s->get() != "auto") expected("experts.ep", *v, "an integer > 0, -1 or \"auto\"");
        spec->experts.ep = -1;
      } else {
        spec->experts.ep = get_int(*v, "experts.ep", "an integer > 0, -1 or \"auto\"");
        // 0 would mean "no expert grid": in a file it is just a bad size.
        if (spec->experts.ep == 0 || spec->experts.ep < -1)
          fail(v->source(), "experts.ep: expected a positive integer or -1 (inferred), "
                            "found " + std::to_string(spec->experts.ep));
      }
    }
    if (auto v = t.get("tp")) {
      spec->experts.tp_pos = pos(v->source());
      spec->experts.tp = get_int(*v, "experts.tp", "a positive integer");
      if (spec->experts.tp <= 0)
        fail(v->source(), "experts.tp: expected a positive integer (leave it out for "
                          "the mesh's tp size), found " + std::to_string(spec->experts.tp));
    }
    if (auto v = t.get("order")) {
      spec->experts.order_pos = pos(v->source());
      auto s = v->as_string();
      if (!s) expected("experts.order", *v, "a Megatron order string like \"tp-cp-ep-dp-pp\"");
      if (s->get().empty() || s->get().size() >= sizeof spec->experts.order)
        fail(v->source(), "experts.order: expected 1 to " +
                              std::to_string(sizeof spec->experts.order - 1) +
                              " chars like \"tp-cp-ep-dp-pp\", found \"" + s->get() + "\"");
      std::strcpy(spec->experts.order, s->get().c_str());
    }
  }

  void read(const toml::table &root) {
    only_keys(root, "", {"mesh", "topology", "sync", "backend", "experts"});
    auto mesh = root.get("mesh");
    if (!mesh) {
      mpg__fail_at(MPG_ERR_SPEC, spec->source, mpg_srcpos{1, 1},
                   "mesh: missing section [mesh] with dims = [...]");
      throw failure{MPG_ERR_SPEC};
    }
    read_mesh(*mesh);
    if (auto s = root.get("topology")) read_topology(*s);
    if (auto s = root.get("sync")) read_sync(*s);
    if (auto s = root.get("backend")) read_backend(*s);
    if (auto s = root.get("experts")) read_experts(*s);
  }
};

mpg_status load(std::string_view text, const char *name, mpg_spec *spec) {
  std::snprintf(spec->source, sizeof spec->source, "%s", name);
  reader r{spec};
  mpg_status st = MPG_OK;
  try {
    toml::table root = toml::parse(text, std::string_view(name));
    r.read(root);
    st = mpg__spec_validate_at(spec, r.opt_pos);
  } catch (const toml::parse_error &e) {
    st = mpg__fail_at(MPG_ERR_PARSE, name, reader::pos(e.source()),
                      "TOML syntax error: %.*s",
                      static_cast<int>(e.description().size()),
                      e.description().data());
  } catch (const failure &f) {
    st = f.status;
  } catch (const std::bad_alloc &) {
    st = mpg__fail(MPG_ERR_NOMEM, "%s: out of memory reading the spec", name);
  } catch (...) {
    st = mpg__fail(MPG_ERR_PARSE, "%s: unexpected error reading the spec", name);
  }
  return st;
}

/* Read the file at `path` into *spec (a full, default spec). */
mpg_status load_file(const char *path, mpg_spec *spec) {
  if (std::strlen(path) >= MPG_PATH_MAX)
    return mpg__fail(MPG_ERR_INVALID, "mpg_spec_load_file: path longer than %d bytes",
                     MPG_PATH_MAX - 1);
  struct stat sb;
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return mpg__fail(MPG_ERR_IO, "%s: cannot read spec file: %s", path,
                     S_ISDIR(sb.st_mode) ? "is a directory" : "not a regular file");
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      int err = errno;
      return mpg__fail(MPG_ERR_IO, "%s: cannot open spec file: %s", path,
                       std::strerror(err));
    }
    std::ostringstream buf;
    buf << in.rdbuf();
    if (in.bad()) return mpg__fail(MPG_ERR_IO, "%s: cannot read spec file", path);
    std::string text = buf.str();
    return load(text, path, spec);
  } catch (...) {
    return mpg__fail(MPG_ERR_NOMEM, "%s: out of memory reading the spec", path);
  }
}

/* A loader's frame: check the caller's spec, read `input` into a full
 * default spec with `read`, and hand back the result, or the defaults on
 * error (within the caller's size). */
template <typename Read>
mpg_status load_into(mpg_spec *caller, const char *fn, const void *input,
                     const char *input_name, Read read) {
  char what[64];
  std::snprintf(what, sizeof what, "%s: spec", fn);
  mpg_status st = mpg__abi_check(caller, MPG_SPEC_MAGIC, what, "MPG_SPEC_INIT");
  if (st) return st;
  mpg_spec full;
  std::memcpy(&full, &mpg__spec_defaults, sizeof full);
  st = input ? read(&full) : mpg__fail(MPG_ERR_INVALID, "%s: %s is NULL", fn, input_name);
  if (st) std::memcpy(&full, &mpg__spec_defaults, sizeof full);
  mpg__abi_out(caller, &full, MPG__ABI_END(mpg_spec));
  return st;
}

}  // namespace

extern "C" mpg_status mpg_spec_load_string(const char *toml, const char *name,
                                           mpg_spec *spec) {
  return load_into(spec, "mpg_spec_load_string", toml, "toml", [&](mpg_spec *full) {
    return load(toml, name ? name : "<string>", full);
  });
}

extern "C" mpg_status mpg_spec_load_file(const char *path, mpg_spec *spec) {
  return load_into(spec, "mpg_spec_load_file", path, "path",
                   [&](mpg_spec *full) { return load_file(path, full); });
}
