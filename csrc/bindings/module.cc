// Python bindings (fastps._core). Buffers cross as raw addresses: the Python
// side extracts them from numpy, the buffer protocol, DLPack or a framework's
// data_ptr(), so this module is never compiled against a framework.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/dtype.h"
#include "common/hmac_sha256.h"
#include "kernels/sum.h"
#include "server/server.h"
#include "worker/registry.h"
#include "worker/worker.h"

namespace py = pybind11;
using namespace fastps;

namespace {
void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "fastps C++ core: summation server, worker pipeline, kernels";

  m.def("simd_level", [] { return std::string(simd_level()); });
  m.def("set_simd_level", [](const std::string& l) { return set_simd_level(l.c_str()); });
  m.def("dtype_size", [](const std::string& d) { return dtype_size(dtype_from_name(d)); });
  m.def("sum_into", [](uintptr_t dst, uintptr_t src, size_t count, const std::string& dt) {
    py::gil_scoped_release nogil;
    sum_into(as_ptr(dst), as_ptr(src), count, dtype_from_name(dt));
  });
  m.def("sum_to",
        [](uintptr_t dst, uintptr_t a, uintptr_t b, size_t count, const std::string& dt) {
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
      .def(py::init([](uint32_t num_workers, const std::string& job_id, const std::string& token,
                       const std::string& host, int port, int engine_threads, int io_threads,
                       uint32_t server_id) {
             ServerOptions o;
             o.num_workers = num_workers;
             o.job_id = job_id;
             o.token = token;
             o.host = host;
             o.port = port;
             o.engine_threads = engine_threads;
             o.io_threads = io_threads;
             o.server_id = server_id;
             return std::make_unique<Server>(o);
           }),
           py::arg("num_workers"), py::arg("job_id"), py::arg("token"),
           py::arg("host") = "0.0.0.0", py::arg("port") = 0, py::arg("engine_threads") = 1,
           py::arg("io_threads") = 1, py::arg("server_id") = 0)
      .def("start", &Server::start, py::call_guard<py::gil_scoped_release>())
      .def("stop", &Server::stop, py::call_guard<py::gil_scoped_release>())
      .def("error", &Server::error)
      .def("parts_summed", &Server::parts_summed)
      .def("refused_connections", &Server::refused_connections)
      .def("set_pacing", &Server::set_pacing, py::arg("per_rank_bytes_per_s"));

  py::class_<Worker>(m, "Worker")
      .def(py::init([](uint32_t rank, uint32_t num_workers, std::vector<std::string> servers,
                       const std::string& job_id, const std::string& token,
                       size_t partition_bytes, size_t credit_bytes, int conns_per_server,
                       double connect_timeout_s, std::vector<double> server_weights,
                       std::vector<uint32_t> local_ranks, std::vector<bool> local_servers,
                       uint32_t num_hosts, bool shm, size_t shm_bytes, size_t window_bytes,
                       size_t notsent_lowat, std::vector<double> pacing_bytes_per_s) {
             WorkerOptions o;
             o.rank = rank;
             o.num_workers = num_workers;
             o.servers = std::move(servers);
             o.job_id = job_id;
             o.token = token;
             o.partition_bytes = partition_bytes;
             o.credit_bytes = credit_bytes;
             o.conns_per_server = conns_per_server;
             o.connect_timeout_s = connect_timeout_s;
             o.server_weights = std::move(server_weights);
             o.local_ranks = std::move(local_ranks);
             o.local_servers = std::move(local_servers);
             o.num_hosts = num_hosts;
             o.shm = shm;
             o.shm_bytes = shm_bytes;
             o.window_bytes = window_bytes;
             o.notsent_lowat = notsent_lowat;
             o.pacing_bytes_per_s = std::move(pacing_bytes_per_s);
             return std::make_unique<Worker>(o);
           }),
           py::arg("rank"), py::arg("num_workers"), py::arg("servers"), py::arg("job_id"),
           py::arg("token"), py::arg("partition_bytes") = 4u << 20,
           py::arg("credit_bytes") = 4u << 20, py::arg("conns_per_server") = 1,
           py::arg("connect_timeout_s") = 60.0,
           py::arg("server_weights") = std::vector<double>{},
           py::arg("local_ranks") = std::vector<uint32_t>{},
           py::arg("local_servers") = std::vector<bool>{}, py::arg("num_hosts") = 0,
           py::arg("shm") = true, py::arg("shm_bytes") = size_t(256u << 20),
           py::arg("window_bytes") = size_t(1u << 20),
           py::arg("notsent_lowat") = size_t(128u << 10),
           py::arg("pacing_bytes_per_s") = std::vector<double>{})
      .def("start", &Worker::start, py::call_guard<py::gil_scoped_release>())
      .def(
          "push_pull",
          [](Worker& w, uintptr_t in, uintptr_t out, size_t nbytes, const std::string& dtype,
             const std::string& name, int priority, double scale) {
            DType dt = dtype_from_name(dtype);
            py::gil_scoped_release nogil;
            return w.push_pull(as_ptr(in), as_ptr(out), nbytes, dt, name, priority, scale);
          },
          py::arg("in_ptr"), py::arg("out_ptr"), py::arg("nbytes"), py::arg("dtype"),
          py::arg("name"), py::arg("priority") = 0, py::arg("scale") = 1.0)
      .def(
          "push_pull_group",
          [](Worker& w, const std::vector<std::tuple<uintptr_t, uintptr_t, size_t, std::string,
                                                     std::string, int, double>>& rows) {
            std::vector<PushPullRequest> reqs(rows.size());
            for (size_t i = 0; i < rows.size(); ++i) {
              auto& [in, out, nbytes, dtype, name, priority, scale] = rows[i];
              reqs[i] = PushPullRequest{
                  as_ptr(in), as_ptr(out), nbytes, dtype_from_name(dtype), name, priority, scale};
            }
            py::gil_scoped_release nogil;
            return w.push_pull_group(reqs);
          },
          py::arg("requests"),
          "Starts a push_pull per (in_ptr, out_ptr, nbytes, dtype, name, priority, scale): "
          "all or none; handle ids in order.")
      .def("poll", &Worker::poll)
      .def("wait", &Worker::wait, py::arg("handle"), py::arg("timeout_s"),
           py::call_guard<py::gil_scoped_release>())
      .def("release", &Worker::release)
      .def("abort", &Worker::abort, py::arg("reason"), py::arg("quiet") = false,
           py::call_guard<py::gil_scoped_release>())
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
             return d;
           })
      .def("shutdown", &Worker::shutdown, py::call_guard<py::gil_scoped_release>());
}
