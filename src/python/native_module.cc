// gpulock._native: the pybind11 extension under the Python package (python/gpulock). It binds
// the C++ library directly; the Python modules above it shape the public API.
//
// Waiting for GPUs releases the GIL, so other Python threads run meanwhile, and checks for
// signals whenever one interrupts the wait (and every 500 ms), so Ctrl-C stops a wait with
// KeyboardInterrupt (or whatever the process's SIGINT handler raises) and leaves nothing behind:
// the queue ticket goes with the exception.
#include <unistd.h>

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpulock/error.hpp"
#include "gpulock/gpu_pool.hpp"
#include "gpulock/jobs.hpp"
#include "gpulock/json_output.hpp"
#include "gpulock/monitor.hpp"
#include "gpulock/parse.hpp"
#include "gpulock/run.hpp"
#include "gpulock/version.hpp"
#include "python/cuda_state.h"

namespace py = pybind11;

namespace gpulock::python {
namespace {

// The Python exception classes, defined in gpulock/_errors.py and looked up once at import.
struct ErrorClasses {
  py::object invalid_request, unsatisfiable, setup, permission_denied, not_found, timeout,
      unavailable, config, internal;

  const py::object& for_code(ErrorCode code, bool waited) const {
    switch (code) {
      case ErrorCode::kInvalidArgument:
        return invalid_request;
      case ErrorCode::kUnsatisfiable:
        return unsatisfiable;
      case ErrorCode::kEnvironment:
        return setup;
      case ErrorCode::kPermissionDenied:
        return permission_denied;
      case ErrorCode::kNotFound:
        return not_found;
      case ErrorCode::kTimedOut:
        return waited ? timeout : unavailable;
      case ErrorCode::kConfig:
        return config;
      case ErrorCode::kInterrupted:
      case ErrorCode::kInternal:
        return internal;
    }
    return internal;
  }
};

ErrorClasses& error_classes() {
  // Leaked on purpose: Python objects must not be destroyed after the interpreter finalises.
  static auto* classes = new ErrorClasses();
  return *classes;
}

[[noreturn]] void raise_python_error(const Error& error, bool waited = true) {
  py::object instance = error_classes().for_code(error.code(), waited)(error.what());
  instance.attr("code") = error_code_name(error.code());
  instance.attr("exit_status") = exit_status_for(error.code());
  PyErr_SetObject(instance.get_type().ptr(), instance.ptr());
  throw py::error_already_set();
}

// Runs a call on the library, turning gpulock::Error into the matching Python exception.
template <typename Call>
auto translated(Call&& call) -> decltype(call()) {
  try {
    return call();
  } catch (const Error& error) {
    raise_python_error(error);
  }
}

py::dict progress_to_dict(const WaitProgress& progress) {
  py::dict d;
  d["waited"] = std::chrono::duration<double>(progress.waited).count();
  d["position"] = progress.position;
  d["queue_length"] = progress.queue_length;
  d["standing"] = queue_standing_name(progress.standing);
  d["blocked_by"] = progress.blocked_by;
  py::list blocking;
  for (const auto& b : progress.blocking) {
    py::dict gpu;
    gpu["index"] = b.display_index;
    gpu["uuid"] = b.uuid;
    gpu["reason"] = b.reason;
    blocking.append(gpu);
  }
  d["blocking"] = blocking;
  return d;
}

py::list gpus_of(const Lease& lease) {
  py::list gpus;
  for (const auto& g : lease.gpus()) {
    py::dict gpu;
    gpu["index"] = g.index;
    gpu["display_index"] = g.display_index;
    gpu["uuid"] = g.uuid;
    gpu["name"] = g.name;
    gpu["is_mig_instance"] = g.is_mig_instance;
    gpus.append(gpu);
  }
  return gpus;
}

VisibleFormat visible_format(const std::string& name) {
  if (name == "index") return VisibleFormat::kIndex;
  if (name == "uuid") return VisibleFormat::kUuid;
  throw Error(ErrorCode::kInvalidArgument, "visible must be 'index' or 'uuid', not '" + name + "'");
}

// Whether `error` was raised in a Python signal handler now installed (a frame of its traceback
// runs one): the handler ran inside a callback of ours, but the exception is the program's way
// of ending the wait. Called with the GIL held.
bool raised_by_signal_handler(const py::error_already_set& error) {
  try {
    const py::module_ signal = py::module_::import("signal");
    std::vector<py::object> handler_code;
    for (const py::handle number : signal.attr("valid_signals")()) {
      py::object handler = signal.attr("getsignal")(number);
      if (py::hasattr(handler, "__func__")) handler = handler.attr("__func__");  // a method
      if (py::hasattr(handler, "__code__")) handler_code.push_back(handler.attr("__code__"));
    }
    for (py::object tb = error.trace(); !tb.is_none(); tb = tb.attr("tb_next")) {
      const py::object code = tb.attr("tb_frame").attr("f_code");
      for (const py::object& c : handler_code)
        if (c.is(code)) return true;
    }
  } catch (const py::error_already_set&) {
    // Anything odd while looking: the callback's failure, as before.
  }
  return false;
}

// One acquire call: a request built from keyword arguments, waited for without the GIL.
Lease acquire(GpuPool& pool, LeaseRequest request, const py::object& on_progress) {
  bool signalled = false;
  // An exception that must end the wait (KeyboardInterrupt, SystemExit) raised by the
  // progress callback; raised again once the wait has ended.
  std::optional<py::error_already_set> callback_stop;
  WaitHooks hooks;
  // A signal interrupts the wait's poll at once, so this only bounds the delay for a signal
  // that lands just before the poll starts, and keeps idle waiters nearly asleep.
  hooks.interrupt_poll = std::chrono::milliseconds(500);
  hooks.interrupted = [&signalled, &callback_stop] {
    if (callback_stop) return true;
    py::gil_scoped_acquire gil;
    // Runs the Python-level signal handlers; a non-zero result means one raised (Ctrl-C).
    // The exception stays set in this thread and is raised below.
    if (PyErr_CheckSignals() != 0) signalled = true;
    return signalled;
  };
  std::string progress_error;
  if (!on_progress.is_none()) {
    hooks.on_progress = [&on_progress, &progress_error, &callback_stop](const WaitProgress& p) {
      if (callback_stop) return;
      py::gil_scoped_acquire gil;
      try {
        on_progress(progress_to_dict(p));
      } catch (py::error_already_set& error) {
        // Ctrl-C, or a signal handler of the program's own that raised while the callback ran
        // (Python runs handlers wherever Python code runs): stop waiting, as anywhere else in
        // the wait. Only the callback's own failure lets the wait go on.
        if (!error.matches(PyExc_Exception) || raised_by_signal_handler(error)) {
          callback_stop.emplace(std::move(error));
        } else if (progress_error.empty()) {
          // A failing progress callback must not end the wait; it is reported once.
          progress_error = error.what();
        }
      }
    };
  }
  std::optional<Lease> lease;
  std::optional<Error> failure;
  {
    py::gil_scoped_release nogil;
    try {
      lease = pool.acquire(request, hooks);
    } catch (const Error& error) {
      failure = error;
    }
  }
  if (callback_stop) {
    callback_stop->restore();
    throw py::error_already_set();
  }
  if (!progress_error.empty() &&
      PyErr_WarnEx(PyExc_RuntimeWarning,
                   ("gpulock: the on_wait callback failed: " + progress_error).c_str(), 2) != 0)
    throw py::error_already_set();  // warnings are errors here
  if (failure) {
    if (signalled && PyErr_Occurred() != nullptr) throw py::error_already_set();
    if (failure->code() == ErrorCode::kInterrupted) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
      throw py::error_already_set();
    }
    raise_python_error(*failure, request.wait);
  }
  return std::move(*lease);
}

LeaseRequest make_request(unsigned count, std::vector<std::string> gpus,
                          std::optional<std::uint64_t> min_free_memory,
                          std::optional<unsigned> max_utilization, std::optional<double> max_power,
                          bool allow_foreign, std::optional<double> timeout, bool wait,
                          std::string priority, std::string label, std::string command,
                          std::optional<std::string> visible_devices,
                          std::optional<std::string> enclosing_lease,
                          std::vector<std::string> hosts, std::optional<std::uint64_t> memory,
                          std::optional<unsigned> slots, bool spread) {
  // The bounds of count and the health filters are checked by GpuPool::acquire; only what
  // the conversion to C++ types needs is checked here.
  LeaseRequest request;
  request.count = count;
  request.gpus = std::move(gpus);
  request.min_free_memory_bytes = min_free_memory;
  request.max_utilization_percent = max_utilization;
  request.max_power_watts = max_power;
  request.allow_foreign_processes = allow_foreign;
  request.memory_bytes = memory;
  request.slots = slots;
  request.spread = spread;
  if (timeout) {
    // NaN fails both comparisons; 1e9 s (31 years) keeps the milliseconds far from overflow.
    if (!(*timeout >= 0 && *timeout <= 1e9))
      throw Error(ErrorCode::kInvalidArgument,
                  "timeout must be a number of seconds between 0 and 1e9, or None");
    request.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(*timeout * 1000.0));
  }
  request.wait = wait;
  request.priority = parse_priority(priority);
  request.label = std::move(label);
  request.command = std::move(command);
  request.cuda_visible_devices = std::move(visible_devices);
  if (enclosing_lease && !enclosing_lease->empty()) request.enclosing_lease_id = enclosing_lease;
  request.hosts = std::move(hosts);
  return request;
}

}  // namespace
}  // namespace gpulock::python

PYBIND11_MODULE(_native, m) {
  using namespace gpulock;
  using namespace gpulock::python;
  m.doc() = "gpulock's C++ library, bound for the gpulock package (use `import gpulock`).";
  m.attr("__version__") = GPULOCK_VERSION_STRING;

  {
    py::module_ errors = py::module_::import("gpulock._errors");
    ErrorClasses& classes = error_classes();
    classes.invalid_request = errors.attr("InvalidRequest");
    classes.unsatisfiable = errors.attr("Unsatisfiable");
    classes.setup = errors.attr("SetupError");
    classes.permission_denied = errors.attr("PermissionDenied");
    classes.not_found = errors.attr("NotFound");
    classes.timeout = errors.attr("Timeout");
    classes.unavailable = errors.attr("Unavailable");
    classes.config = errors.attr("ConfigError");
    classes.internal = errors.attr("InternalError");
  }

  py::class_<Lease>(m, "Lease")
      .def_property_readonly("id", &Lease::id)
      .def_property_readonly("memory_bytes", &Lease::memory_bytes)
      .def_property_readonly("active", &Lease::active)
      .def_property_readonly("gpus", &gpus_of)
      .def_property_readonly("fencing_token", &Lease::fencing_token)
      .def_property_readonly("host", &Lease::host)
      .def_property_readonly("lost", &Lease::lost)
      .def("verify",
           [](Lease& lease) {
             // One round trip to Redis: without the GIL; the error is raised with it back.
             std::optional<Error> failure;
             std::uint64_t token = 0;
             {
               py::gil_scoped_release released;
               try {
                 token = lease.verify();
               } catch (const Error& error) {
                 failure = error;
               }
             }
             if (failure) raise_python_error(*failure);
             return token;
           })
      .def_property_readonly(
          "started_at",
          [](const Lease& lease) {
            return std::chrono::duration<double>(lease.started_at().time_since_epoch()).count();
          })
      .def(
          "cuda_visible_devices",
          [](const Lease& lease, const std::string& format) {
            return translated([&] { return lease.cuda_visible_devices(visible_format(format)); });
          },
          py::arg("visible") = "index")
      .def(
          "environment",
          [](const Lease& lease, const std::string& format) {
            return translated([&] { return lease_environment(lease, visible_format(format)); });
          },
          py::arg("visible") = "index")
      .def("release", [](Lease& lease) { translated([&] { lease.release(); }); });

  py::class_<GpuPool>(m, "Pool")
      .def(py::init([](std::optional<std::string> lock_dir) {
             return translated([&] {
               PoolOptions options;
               if (lock_dir) options.lock_dir = *lock_dir;
               return GpuPool::open(std::move(options));
             });
           }),
           py::arg("lock_dir") = py::none())
      .def_property_readonly("lock_dir",
                             [](const GpuPool& pool) { return pool.lock_dir().string(); })
      .def_property_readonly("warnings", &GpuPool::warnings)
      .def_property_readonly("backend", &GpuPool::backend_name)
      .def_property_readonly("spans_hosts", &GpuPool::spans_hosts)
      .def(
          "acquire",
          [](GpuPool& pool, unsigned count, std::vector<std::string> gpus,
             std::optional<std::uint64_t> min_free_memory, std::optional<unsigned> max_utilization,
             std::optional<double> max_power, bool allow_foreign, std::optional<double> timeout,
             bool wait, std::string priority, std::string label, std::string command,
             std::optional<std::string> visible_devices, std::optional<std::string> enclosing_lease,
             std::vector<std::string> hosts, py::object on_progress,
             std::optional<std::uint64_t> memory, std::optional<unsigned> slots, bool spread) {
            LeaseRequest request = translated([&] {
              return make_request(count, std::move(gpus), min_free_memory, max_utilization,
                                  max_power, allow_foreign, timeout, wait, std::move(priority),
                                  std::move(label), std::move(command), std::move(visible_devices),
                                  std::move(enclosing_lease), std::move(hosts), memory, slots,
                                  spread);
            });
            return acquire(pool, std::move(request), on_progress);
          },
          py::kw_only(), py::arg("count") = 1, py::arg("gpus") = std::vector<std::string>{},
          py::arg("min_free_memory") = py::none(), py::arg("max_utilization") = py::none(),
          py::arg("max_power") = py::none(), py::arg("allow_foreign") = false,
          py::arg("timeout") = py::none(), py::arg("wait") = true, py::arg("priority") = "normal",
          py::arg("label") = "", py::arg("command") = "", py::arg("visible_devices") = py::none(),
          py::arg("enclosing_lease") = py::none(), py::arg("hosts") = std::vector<std::string>{},
          py::arg("on_progress") = py::none(), py::arg("memory") = py::none(),
          py::arg("slots") = py::none(), py::arg("spread") = false)
      .def("status_json",
           [](GpuPool& pool) {
             return translated([&] {
               // Idle GPUs as `gpulock status` sees them: the same readings file.
               PoolStatus status = pool.status();
               IdleTracker(default_idle_record_path()).observe(status, pool.config().idle_after);
               return status_to_json(status);
             });
           })
      .def("queue_json",
           [](GpuPool& pool) { return translated([&] { return queue_to_json(pool.queue()); }); })
      .def("gpus_json",
           [](GpuPool& pool) {
             return translated([&] {
               auto& source = pool.device_source();
               return devices_to_json(pool.devices(), source.description(), source.simulated());
             });
           })
      .def("release", [](GpuPool& pool, const std::string& lease_id) {
        translated([&] { pool.release(lease_id); });
      });

  m.def(
      "parse_size",
      [](const std::string& text) { return translated([&] { return parse_size(text); }); },
      "Bytes in a size such as '20G', '512M' or '1073741824' (as the CLI's --min-free-mem).");
  m.def(
      "parse_gpu_list",
      [](const std::string& text) { return translated([&] { return parse_gpu_list(text); }); },
      "The entries of a GPU list such as '0,2' or 'GPU-3f…' (as the CLI's --gpus).");
  m.def(
      "jobs_json",
      [](bool all_users) {
        return translated([&] {
          std::vector<JobInfo> shown;
          for (JobInfo& job : JobStore::open(default_jobs_directory()).list())
            if (all_users || job.owner == ::geteuid()) shown.push_back(std::move(job));
          return jobs_to_json(shown);
        });
      },
      py::arg("all_users") = false,
      "`gpulock jobs --json`: the caller's jobs, or every user's, in the machine's store.");
  m.def("cuda_initialized", &cuda_initialized_in_process,
        "True if this process has loaded the CUDA driver and initialised it (cuInit), after "
        "which CUDA_VISIBLE_DEVICES is no longer read.");
}
