#ifndef TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_COMPAT_GLOO_COMMON_MEMORY_H_
#define TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_COMPAT_GLOO_COMMON_MEMORY_H_

// Debian's libgloo-dev ships gloo/transport/tcp/pair.h but not the gloo/common/memory.h it
// includes. gloo_communicator.cc needs pair.h only to read a connected pair's socket, a member
// declared before every member whose type comes from this header, so these stand-ins for the two
// pointer types pair.h names need only compile: nothing here constructs, copies or destroys a
// pair, or touches those members. (They hold what Gloo's hold, a weak and a shared pointer.)
// Used only where the real header is missing (worker/trainer/CMakeLists.txt).

#include <memory>

namespace gloo {

template <typename T>
class WeakNonOwningPtr final {
 public:
  WeakNonOwningPtr() = default;

 private:
  std::weak_ptr<T> ptr_;
};

template <typename T>
class NonOwningPtr final {
 public:
  NonOwningPtr() = default;
  T* operator->() const noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  std::shared_ptr<T> ptr_;
};

}  // namespace gloo

#endif  // TRAINYARD_WORKER_TRAINER_COLLECTIVE_GLOO_COMPAT_GLOO_COMMON_MEMORY_H_
