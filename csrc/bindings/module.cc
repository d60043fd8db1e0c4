// Python bindings (fastps._core). Buffers cross as raw addresses: the Python
// side extracts them from numpy, the buffer protocol, DLPack or a framework's
// data_ptr(), so this module is never compiled against a framework.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <tuple>

#include "common/dtype.h"
#include "common/errors.h"
#include "common/hmac_sha256.h"
#include "common/trace.h"
#include "compression/part_codec.h"
#include "kernels/sum.h"
#include "server/outer_optimizer.h"
#include "server/server.h"
#include "worker/partitioner.h"
#include "worker/push_scheduler.h"
#include "worker/registry.h"
#include "worker/worker.h"

namespace py = pybind11;
using namespace fastps;

namespace fastps {
void bind_build_info(py::module_& m);  // bindings/build_info.cc
}

namespace {
void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

PushMode push_mode_of(int mode, const std::string& name) {
  if (mode < 0 || mode >= kPushModes)
    throw std::invalid_argument("push_pull of '" + name + "': mode " + std::to_string(mode) +
                                " is not 0.." + std::to_string(kPushModes - 1));
  return static_cast<PushMode>(mode);
}
int64_t to_us(double seconds) { return static_cast<int64_t>(std::llround(seconds * 1e6)); }

// A list-valued option: read as a tuple, so that `opts.servers.append(x)` fails
// loudly instead of changing a copy; set by assigning a whole list.
template <class T, class V>
void list_option(py::class_<T>& cls, const char* name, std::vector<V> T::* field) {
  cls.def_property(
      name, [field](const T& o) { return py::tuple(py::cast(o.*field)); },
      [field](T& o, std::vector<V> v) { o.*field = std::move(v); });
}

// The options structs are plain fields set by name from fastps.config.Config
// (core/worker/api.py, core/control/server.py); their zero values mean "unset" and the
// constructors refuse what must be set (check_options).
void bind_options(py::module_& m) {
  py::class_<ServerOptions> so(m, "ServerOptions");
  so.def(py::init<>())
      .def_readwrite("server_id", &ServerOptions::server_id)
      .def_readwrite("num_workers", &ServerOptions::num_workers)
      .def_readwrite("job_id", &ServerOptions::job_id)
      .def_readwrite("token", &ServerOptions::token)
      .def_readwrite("host", &ServerOptions::host)
      .def_readwrite("port", &ServerOptions::port)
      .def_readwrite("io_threads", &ServerOptions::io_threads)
      .def_readwrite("engine_threads", &ServerOptions::engine_threads)
      .def_readwrite("handshake_timeout_s", &ServerOptions::handshake_timeout_s)
      .def_readwrite("max_pending_handshakes", &ServerOptions::max_pending_handshakes)
      .def_readwrite("worker_may_reconnect", &ServerOptions::worker_may_reconnect)
      .def_readwrite("round_quorum", &ServerOptions::round_quorum)
      .def_readwrite("round_quorum_fraction", &ServerOptions::round_quorum_fraction)
      .def_readwrite("quorum_history", &ServerOptions::quorum_history)
      .def_readwrite("nudge", &ServerOptions::nudge)
      .def_readwrite("nudge_overdue_us", &ServerOptions::nudge_overdue_us)
      .def_readwrite("staleness", &ServerOptions::staleness);

  py::class_<WorkerOptions> wo(m, "WorkerOptions");
  wo.def(py::init<>())
      .def_readwrite("rank", &WorkerOptions::rank)
      .def_readwrite("num_workers", &WorkerOptions::num_workers)
      .def_readwrite("job_id", &WorkerOptions::job_id)
      .def_readwrite("token", &WorkerOptions::token)
      .def_readwrite("partition_bytes", &WorkerOptions::partition_bytes)
      .def_readwrite("credit_bytes", &WorkerOptions::credit_bytes)
      .def_readwrite("window_bytes", &WorkerOptions::window_bytes)
      .def_readwrite("nudge_min_wait_us", &WorkerOptions::nudge_min_wait_us)
      .def_readwrite("push_from_io", &WorkerOptions::push_from_io)
      .def_readwrite("notsent_lowat", &WorkerOptions::notsent_lowat)
      .def_readwrite("pacing_burst_bytes", &WorkerOptions::pacing_burst_bytes)
      .def_readwrite("pacing_burst_bytes_per_s", &WorkerOptions::pacing_burst_bytes_per_s)
      .def_readwrite("conns_per_server", &WorkerOptions::conns_per_server)
      .def_readwrite("connect_timeout_s", &WorkerOptions::connect_timeout_s)
      .def_readwrite("num_hosts", &WorkerOptions::num_hosts)
      .def_readwrite("fusion_threshold", &WorkerOptions::fusion_threshold)
      .def_readwrite("shm", &WorkerOptions::shm)
      .def_readwrite("quorum", &WorkerOptions::quorum)
      .def_readwrite("shm_bytes", &WorkerOptions::shm_bytes)
      .def_readwrite("rack_pushers", &WorkerOptions::rack_pushers);
  list_option(wo, "servers", &WorkerOptions::servers);
  list_option(wo, "server_weights", &WorkerOptions::server_weights);
  list_option(wo, "pacing_bytes_per_s", &WorkerOptions::pacing_bytes_per_s);
  list_option(wo, "local_ranks", &WorkerOptions::local_ranks);
  list_option(wo, "local_servers", &WorkerOptions::local_servers);
  list_option(wo, "relay_via", &WorkerOptions::relay_via);
  list_option(wo, "owner_pushers", &WorkerOptions::owner_pushers);
}

// The core's error types become subclasses of fastps.errors' classes, so
// `except FastPSTimeoutError` catches a core timeout by type. Registered base
// first: pybind11 tries the most recently registered translator first.
void bind_errors(py::module_& m) {
  py::module_ errors = py::module_::import("fastps.errors");
  py::register_exception<Error>(m, "CoreError", errors.attr("FastPSError"));
  py::register_exception<TimeoutError>(m, "CoreTimeoutError", errors.attr("FastPSTimeoutError"));
  py::register_exception<AbortError>(m, "CoreAbort", errors.attr("FastPSAbort"));
}
// Local SGD / DiLoCo (server/outer_optimizer.h): the in-band OuterHeader the workers put in
// front of each part (protocol/messages.h), and the servers' update rule itself (a single
// worker, which has no servers, applies it locally).
void bind_outer(py::module_& m) {
  m.attr("OUTER_HEADER_BYTES") = sizeof(OuterHeader);
  m.attr("OUTER_INIT") = kOuterInit;
  m.attr("OUTER_DELTA") = kOuterDelta;
  m.attr("OUTER_PARAMS") = kOuterParams;
  m.def(
      "outer_header",
      [](uint32_t kind, uint64_t round, double lr, double momentum, bool nesterov, uint64_t tensor,
         uint32_t part, uint32_t wire_len) {
        OuterHeader h{};
        h.magic = kOuterMagic;
        h.kind = kind;
        h.flags = nesterov ? kOuterNesterov : 0;
        if (wire_len) h.flags |= kOuterCompressed;
        h.round = round;
        h.lr = lr;
        h.momentum = momentum;
        h.tensor = tensor;
        h.part = part;
        h.wire_len = wire_len;
        h.check = outer_check(h);
        return py::bytes(reinterpret_cast<const char*>(&h), sizeof h);
      },
      py::arg("kind"), py::arg("round"), py::arg("lr"), py::arg("momentum"), py::arg("nesterov"),
      py::arg("tensor"), py::arg("part"), py::arg("wire_len") = 0,
      "wire_len > 0: a compressed delta's header, whose part sends that many bytes.");
  // Compressed outer deltas: the worker's residuals (error feedback) per part key, and the
  // encoding of one part's delta into the framed buffer right after its header.
  py::class_<ErrorFeedback>(m, "ErrorFeedback")
      .def(py::init<>())
      .def("clear", &ErrorFeedback::clear)
      .def("parts", &ErrorFeedback::parts);
  m.def(
      "encode_part_into",
      [](const std::string& spec, uintptr_t src, const std::string& dtype, size_t n, uint64_t seed,
         ErrorFeedback* ef, uint64_t key, uintptr_t dst, size_t capacity) {
        CompressionSpec s = CompressionSpec::parse(spec);
        if (!s.enabled())
          throw std::invalid_argument("encode_part_into: spec '" + spec + "' is none");
        DType dt = dtype_from_name(dtype);
        if (s.error_feedback && !ef)
          throw std::invalid_argument("encode_part_into: " + s.describe() +
                                      " needs an ErrorFeedback");
        auto bytes = encode_part(s, as_ptr(src), dt, n, seed, s.error_feedback ? ef : nullptr, key);
        if (bytes->size() > capacity)
          throw std::invalid_argument("encode_part_into: " + std::to_string(bytes->size()) +
                                      " bytes do not fit in " + std::to_string(capacity));
        std::memcpy(as_ptr(dst), bytes->data(), bytes->size());
        return bytes->size();
      },
      py::arg("spec"), py::arg("src_ptr"), py::arg("dtype"), py::arg("n"), py::arg("seed"),
      py::arg("ef").none(true), py::arg("key"), py::arg("dst_ptr"), py::arg("capacity"),
      "Encodes n values of dtype at src_ptr (error feedback through ef, by part key) into "
      "dst_ptr; returns the bytes written (compressed header and body).");
  m.def(
      "compressed_bytes",
      [](const std::string& spec, size_t n) {
        return compressed_bytes(CompressionSpec::parse(spec), n);
      },
      py::arg("spec"), py::arg("n"), "The bytes a compressed part of n values takes.");
  // None when the bytes hold no valid header.
  m.def("parse_outer_header", [](const py::bytes& b) -> py::object {
    std::string s = b;
    OuterHeader h;
    if (s.size() < sizeof h) return py::none();
    std::memcpy(&h, s.data(), sizeof h);
    if (h.magic != kOuterMagic || h.check != outer_check(h)) return py::none();
    py::dict d;
    d["kind"] = h.kind;
    d["round"] = h.round;
    d["lr"] = h.lr;
    d["momentum"] = h.momentum;
    d["nesterov"] = (h.flags & kOuterNesterov) != 0;
    d["tensor"] = h.tensor;
    d["part"] = h.part;
    d["compressed"] = (h.flags & kOuterCompressed) != 0;
    d["wire_len"] = h.wire_len;
    return std::move(d);
  });
  m.def("outer_config_error", [](double lr, double momentum, bool nesterov) {
    return outer_config_error(OuterConfig{lr, momentum, nesterov});
  });
  py::class_<OuterOptimizer>(m, "OuterOptimizer")
      .def(py::init([](double lr, double momentum, bool nesterov) {
             return OuterOptimizer(OuterConfig{lr, momentum, nesterov});
           }),
           py::arg("lr"), py::arg("momentum"), py::arg("nesterov"))
      // params, mean_delta: addresses of `count` float64 values.
      .def(
          "step",
          [](OuterOptimizer& o, uintptr_t params, uintptr_t mean_delta, size_t count) {
            py::gil_scoped_release nogil;
            o.step(static_cast<double*>(as_ptr(params)),
                   static_cast<const double*>(as_ptr(mean_delta)), count);
          },
          py::arg("params"), py::arg("mean_delta"), py::arg("count"))
      .def("steps", &OuterOptimizer::steps);
}
}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "fastps C++ core: summation server, worker pipeline, kernels";
  bind_errors(m);
  bind_options(m);
  bind_build_info(m);

  m.def("simd_level", [] { return std::string(simd_level()); });
  m.def("set_simd_level", [](const std::string& l) { return set_simd_level(l.c_str()); });
  m.def("dtype_size", [](const std::string& d) { return dtype_size(dtype_from_name(d)); });
  m.def("sum_into", [](uintptr_t dst, uintptr_t src, size_t count, const std::string& dt) {
    py::gil_scoped_release nogil;
    sum_into(as_ptr(dst), as_ptr(src), count, dtype_from_name(dt));
  });
  m.def("sum_to", [](uintptr_t dst, uintptr_t a, uintptr_t b, size_t count, const std::string& dt) {
    py::gil_scoped_release nogil;
    sum_to(as_ptr(dst), as_ptr(a), as_ptr(b), count, dtype_from_name(dt));
  });
  m.def("scale", [](uintptr_t dst, size_t count, const std::string& dt, double f) {
    py::gil_scoped_release nogil;
    scale(as_ptr(dst), count, dtype_from_name(dt), f);
  });
  m.def("hmac_sha256", [](const py::bytes& key, const py::bytes& msg) {
    std::string k = key, s = msg;
    Digest d = hmac_sha256(k.data(), k.size(), s.data(), s.size());
    return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
  });
  m.def("tensor_id", &tensor_id_of);
  bind_outer(m);
  // The worker's push order and limits, for the simulator: it feeds the real scheduler
  // tickets (priority, tensor, part, server, len, tag) and tells it what was written and
  // answered, so simulated pushes follow the same urgency, credit and window rules. Times
  // (now) are the simulation's seconds.
  py::class_<PushScheduler>(m, "PushScheduler")
      .def(py::init([](size_t credit, size_t window, const std::vector<double>& weights,
                       double boost_min_wait_s) {
             return new PushScheduler(credit, window, weights, to_us(boost_min_wait_s));
           }),
           py::arg("credit_bytes"), py::arg("window_bytes"), py::arg("server_weights"),
           py::arg("boost_min_wait_s") = 0.0)
      .def(
          "enqueue",
          [](PushScheduler& s,
             const std::vector<std::tuple<int, uint64_t, uint32_t, uint32_t, size_t, int64_t>>&
                 parts,
             double now) {
            std::vector<PushTicket> t;
            t.reserve(parts.size());
            for (auto& p : parts)
              t.push_back(PushTicket{std::get<0>(p), std::get<1>(p), std::get<2>(p), std::get<3>(p),
                                     std::get<4>(p), std::get<5>(p), to_us(now)});
            s.enqueue(t);
          },
          py::arg("parts"), py::arg("now") = 0.0)
      .def("take_admissible",
           [](PushScheduler& s) {
             std::vector<PushTicket> out;
             s.take_admissible(&out);
             std::vector<std::tuple<int, uint64_t, uint32_t, uint32_t, size_t, int64_t>> r;
             r.reserve(out.size());
             for (auto& t : out)
               r.emplace_back(t.priority, t.tensor, t.part, t.server, t.len, t.tag);
             return r;
           })
      .def(
          "written", [](PushScheduler& s, uint32_t server, size_t len) { s.written(server, len); },
          py::arg("server"), py::arg("len"))
      .def(
          "answered",
          [](PushScheduler& s, int priority, uint64_t tensor, uint32_t part, uint32_t server) {
            s.answered(PushTicket{priority, tensor, part, server, 0, 0});
          },
          py::arg("priority"), py::arg("tensor"), py::arg("part"), py::arg("server"))
      .def(
          "boost",
          [](PushScheduler& s, int priority, uint64_t tensor, uint32_t part, uint32_t server,
             int64_t tag, double now) {
            return s.boost(PushTicket{priority, tensor, part, server, 0, tag}, to_us(now));
          },
          py::arg("priority"), py::arg("tensor"), py::arg("part"), py::arg("server"),
          py::arg("tag") = 0, py::arg("now") = 0.0)
      .def("boosts", &PushScheduler::boosts)
      .def("window", &PushScheduler::window)
      .def("queued", &PushScheduler::queued)
      .def("unanswered_bytes", &PushScheduler::unanswered_bytes);
  // The worker's real cut of one tensor into parts, for the simulator (fastps.sim), so it
  // plans with the same parts and servers as a job: [(index, offset, len, server)].
  m.def("partition", [](size_t partition_bytes, std::vector<double> weights, uint64_t tensor_id,
                        size_t nbytes, size_t elem_size) {
    if (elem_size == 0) throw std::invalid_argument("elem_size must be > 0");
    Partitioner p(partition_bytes, std::move(weights));
    std::vector<std::tuple<uint32_t, size_t, size_t, uint32_t>> out;
    for (const PartSpan& s : p.split(tensor_id, nbytes, elem_size))
      out.emplace_back(s.index, s.offset, s.len, s.server);
    return out;
  });
  // The compressors on their own (docs/guide/compression.md), for tests and tools: the same
  // encoding a worker pushes and a server answers with.
  m.def(
      "compression_spec",
      [](const std::string& text) { return CompressionSpec::parse(text).describe(); },
      py::arg("text"), "The canonical form of a compressor spec; ValueError if it is bad.");
  m.def(
      "compress",
      [](const std::string& spec, uintptr_t values, size_t n, uint64_t seed) {
        CompressionSpec s = CompressionSpec::parse(spec);
        if (!s.enabled()) throw std::invalid_argument("compress: spec '" + spec + "' is none");
        auto bytes = encode_part(s, as_ptr(values), DType::kFloat32, n, seed, nullptr, 0);
        return py::bytes(bytes->data(), bytes->size());
      },
      py::arg("spec"), py::arg("values_ptr"), py::arg("n"), py::arg("seed") = 0,
      "Compresses n float32 values at values_ptr; returns the payload (header and body).");
  m.def(
      "decompress",
      [](const py::bytes& data, size_t n, uintptr_t out) {
        std::string d = data;
        decode_part(d.data(), d.size(), n, static_cast<float*>(as_ptr(out)), false);
      },
      py::arg("data"), py::arg("n"), py::arg("out_ptr"),
      "Decodes a compressed payload of n values into the float32 array at out_ptr.");
  // The timeline's recorder (common/trace.h); fastps.timeline decodes the drained events.
  m.def("trace_enable", &trace::enable, py::arg("events_per_thread"));
  m.def("trace_disable", &trace::disable);
  m.def("trace_on", &trace::on);
  m.def("trace_drain", [] {
    std::string s;
    {
      py::gil_scoped_release nogil;
      s = trace::drain();
    }
    return py::bytes(s);
  });
  m.def("trace_dropped", &trace::dropped);
  m.def("trace_now_ns", &trace::now_ns);
  // The address of a contiguous buffer-protocol object (a numpy array): numpy's own
  // ways (arr.ctypes.data, __array_interface__) cost ~6 us, paid per tensor per step.
  m.def("buffer_address", [](const py::object& obj) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0)
      throw py::error_already_set();
    auto addr = reinterpret_cast<uintptr_t>(view.buf);
    PyBuffer_Release(&view);
    return addr;
  });

  py::class_<Server>(m, "Server")
      .def(py::init<ServerOptions>(), py::arg("options"))
      .def("start", &Server::start, py::call_guard<py::gil_scoped_release>())
      .def("stop", &Server::stop, py::call_guard<py::gil_scoped_release>())
      .def("error", &Server::error)
      .def("parts_summed", &Server::parts_summed)
      .def("late_pushes", &Server::late_pushes)
      .def("fetched_rounds", &Server::fetched_rounds)
      .def("nudges", &Server::nudges)
      .def("refused_connections", &Server::refused_connections)
      .def("rack_sums_awaiting_route", &Server::rack_sums_awaiting_route)
      .def("set_pacing", &Server::set_pacing, py::arg("per_rank_bytes_per_s"))
      .def("set_pacing_burst", &Server::set_pacing_burst, py::arg("bytes"), py::arg("bytes_per_s"))
      .def("pacing_switches", &Server::pacing_switches)
      .def("set_rack_pacing", &Server::set_rack_pacing, py::arg("answers_by_relay_id"),
           py::arg("up_by_owner"))
      .def("set_rack_route", &Server::set_rack_route, py::arg("owners"), py::arg("owner_ids"),
           py::arg("rank"), py::arg("rack"), py::call_guard<py::gil_scoped_release>());

  py::class_<Worker>(m, "Worker")
      .def(py::init<WorkerOptions>(), py::arg("options"))
      .def("start", &Worker::start, py::call_guard<py::gil_scoped_release>())
      .def(
          "push_pull",
          [](Worker& w, uintptr_t in, uintptr_t out, size_t nbytes, const std::string& dtype,
             const std::string& name, int priority, double scale, bool send, bool receive,
             uint32_t pushers, int mode, const std::string& compression) {
            PushPullRequest r{as_ptr(in), as_ptr(out), nbytes, dtype_from_name(dtype),
                              name,       priority,    scale};
            r.send = send;
            r.receive = receive;
            r.pushers = pushers;
            r.mode = push_mode_of(mode, name);
            r.compression = CompressionSpec::parse(compression);
            py::gil_scoped_release nogil;
            return w.push_pull_group({r}).front();
          },
          py::arg("in_ptr"), py::arg("out_ptr"), py::arg("nbytes"), py::arg("dtype"),
          py::arg("name"), py::arg("priority"), py::arg("scale"), py::arg("send") = true,
          py::arg("receive") = true, py::arg("pushers") = 0, py::arg("mode") = 0,
          py::arg("compression") = "",
          "Starts summing nbytes at in_ptr over the workers into out_ptr. Routed (pushers > "
          "0 workers push each part): send=False only receives the result, receive=False "
          "only contributes (docs/design/architecture.md, \"Bytes on the wire\"). compression: a "
          "compressor spec such as \"topk:0.01:ef\" (docs/guide/compression.md); empty: none.")
      .def(
          "push_pull_group",
          [](Worker& w, const std::vector<py::tuple>& rows) {
            std::vector<PushPullRequest> reqs(rows.size());
            for (size_t i = 0; i < rows.size(); ++i) {
              const py::tuple& row = rows[i];
              if (row.size() != 7 && row.size() != 10 && row.size() != 11 && row.size() != 12)
                throw std::invalid_argument("push_pull_group: request " + std::to_string(i) +
                                            " has " + std::to_string(row.size()) +
                                            " fields; expected 7, 10, 11 or 12");
              PushPullRequest& r = reqs[i];
              r.in = as_ptr(row[0].cast<uintptr_t>());
              r.out = as_ptr(row[1].cast<uintptr_t>());
              r.nbytes = row[2].cast<size_t>();
              r.dtype = dtype_from_name(row[3].cast<std::string>());
              r.name = row[4].cast<std::string>();
              r.priority = row[5].cast<int>();
              r.scale = row[6].cast<double>();
              if (row.size() >= 10) {
                r.send = row[7].cast<bool>();
                r.receive = row[8].cast<bool>();
                r.pushers = row[9].cast<uint32_t>();
              }
              if (row.size() >= 11)
                r.compression = CompressionSpec::parse(row[10].cast<std::string>());
              if (row.size() == 12) r.mode = push_mode_of(row[11].cast<int>(), r.name);
            }
            py::gil_scoped_release nogil;
            return w.push_pull_group(reqs);
          },
          py::arg("requests"),
          "Starts a push_pull per (in_ptr, out_ptr, nbytes, dtype, name, priority, scale"
          "[, send, receive, pushers[, compression[, mode]]]): all or none; handle ids in order.")
      .def(
          "set_fusion_plan",
          [](Worker& w, const std::string& plan,
             const std::vector<std::tuple<std::string, size_t, std::string, int>>& rows) {
            std::vector<FusionMember> members(rows.size());
            for (size_t i = 0; i < rows.size(); ++i) {
              auto& [name, nbytes, dtype, priority] = rows[i];
              members[i] = FusionMember{name, nbytes, dtype_from_name(dtype), priority};
            }
            py::gil_scoped_release nogil;
            return w.set_fusion_plan(plan, members);
          },
          py::arg("plan"), py::arg("members"),
          "Fuses the small tensors among (name, nbytes, dtype, priority) rows from their next "
          "push_pull on, replacing plan `plan`; returns the number of buckets.")
      .def("poll", &Worker::poll)
      .def("wait", &Worker::wait, py::arg("handle"), py::arg("timeout_s"),
           py::call_guard<py::gil_scoped_release>())
      .def("release", &Worker::release)
      .def(
          "abort",
          [](Worker& w, const std::string& reason, bool quiet) {
            w.abort(reason, ErrorKind::kAbort, quiet);
          },
          py::arg("reason"), py::arg("quiet") = false, py::call_guard<py::gil_scoped_release>())
      .def("error", &Worker::error)
      .def("part_layout", &Worker::part_layout, py::arg("name"), py::arg("nbytes"),
           py::arg("elem_size"))
      .def("stats",
           [](const Worker& w) {
             const auto& s = w.stats();
             py::dict d;
             d["local_reduce"] = w.local_reduce();
             d["pushed_shm"] = s.pushed_shm.load();
             d["pushed_socket"] = s.pushed_socket.load();
             d["reduced_locally"] = s.reduced_locally.load();
             d["contributed_shm"] = s.contributed_shm.load();
             d["contributed_socket"] = s.contributed_socket.load();
             d["pushed_routed"] = s.pushed_routed.load();
             d["nudged"] = s.nudged.load();
             d["socket_bytes_sent"] = s.socket_bytes_sent.load();
             d["socket_bytes_received"] = s.socket_bytes_received.load();
             d["pacing_switches"] = s.pacing_switches.load();
             return d;
           })
      .def("shutdown", &Worker::shutdown, py::call_guard<py::gil_scoped_release>());
}
