// ThreadSanitizer and the Abseil of the distribution (make test-tsan, docs/testing.md).
//
// ThreadSanitizer learns that one thread's writes happen before another's reads from the
// synchronisation it sees. Abseil's Mutex tells it of each lock and unlock, but only when Abseil
// itself is built with -fsanitize=thread; Debian's libabsl is not, so every absl::Mutex looks like
// no lock at all and every guarded field like a race. The linker sends our code's calls of
// absl::Mutex, absl::CondVar and absl::Notification here instead (-Wl,--wrap=SYMBOL for each
// symbol below, tests/tsan/CMakeLists.txt), and these wrappers tell ThreadSanitizer what the call
// does, with its annotation interface, around the real call (__real_SYMBOL). Calls Abseil makes
// inside its own library are not seen: none of them guard our data.

#include <sanitizer/tsan_interface.h>

#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" {

// The Abseil of Debian 12 (20220623, inline namespace debian3), by mangled name: Mutex's lock and
// unlock, its conditional forms, CondVar's waits, and Notification (tests/tsan/wrapped_symbols.txt
// lists them for the linker).

void __real__ZN4absl7debian35Mutex4LockEv(void* mu);
void __real__ZN4absl7debian35Mutex6UnlockEv(void* mu);
bool __real__ZN4absl7debian35Mutex7TryLockEv(void* mu);
void __real__ZN4absl7debian35Mutex10ReaderLockEv(void* mu);
void __real__ZN4absl7debian35Mutex12ReaderUnlockEv(void* mu);
bool __real__ZN4absl7debian35Mutex13ReaderTryLockEv(void* mu);
void __real__ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE(void* mu,
                                                              const absl::Condition& cond);
bool __real__ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE(
    void* mu, const absl::Condition& cond, absl::Duration d);
bool __real__ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE(
    void* mu, const absl::Condition& cond, absl::Time t);
void __real__ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(void* mu, const absl::Condition& cond);
bool __real__ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(
    void* mu, const absl::Condition& cond, absl::Duration d);
bool __real__ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE(
    void* mu, const absl::Condition& cond, absl::Time t);
void __real__ZN4absl7debian35MutexD1Ev(void* mu);
void __real__ZN4absl7debian37CondVar4WaitEPNS0_5MutexE(void* cv, void* mu);
bool __real__ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(void* cv, void* mu,
                                                                                 absl::Duration d);
bool __real__ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(void* cv, void* mu,
                                                                              absl::Time t);
void __real__ZN4absl7debian312Notification6NotifyEv(void* n);
void __real__ZNK4absl7debian312Notification19WaitForNotificationEv(const void* n);
bool __real__ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(
    const void* n, absl::Duration d);
bool __real__ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE(
    const void* n, absl::Time t);

}  // extern "C"

namespace {

void Locked(void* mu, unsigned flags = 0) {
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
}
void Unlocking(void* mu, unsigned flags = 0) {
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
}
// A condition as Abseil evaluates it: on the waiting thread after it took the mutex again, or on
// the thread that lets the mutex go, inside Abseil, where no annotation of ours is. It reads what
// the mutex guards: it acquires what the mutex's last holders released, and releases its reads.
struct Guarded {
  void* mu;
  const absl::Condition* cond;
};
bool EvalGuarded(Guarded* g) {
  __tsan_acquire(g->mu);
  const bool met = g->cond->Eval();
  __tsan_release(g->mu);
  return met;
}

// A Notification's flag (std::atomic<bool> after its Mutex), which the inline HasBeenNotified
// reads with acquire: released there too, so that a reader of the flag sees what came before.
void* Flag(const void* n) { return static_cast<char*>(const_cast<void*>(n)) + sizeof(intptr_t); }

}  // namespace

extern "C" {

void __wrap__ZN4absl7debian35Mutex4LockEv(void* mu) {
  __tsan_mutex_pre_lock(mu, 0);
  __real__ZN4absl7debian35Mutex4LockEv(mu);
  __tsan_mutex_post_lock(mu, 0, 0);
}
void __wrap__ZN4absl7debian35Mutex6UnlockEv(void* mu) {
  __tsan_mutex_pre_unlock(mu, 0);
  __real__ZN4absl7debian35Mutex6UnlockEv(mu);
  __tsan_mutex_post_unlock(mu, 0);
}
bool __wrap__ZN4absl7debian35Mutex7TryLockEv(void* mu) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_lock);
  const bool locked = __real__ZN4absl7debian35Mutex7TryLockEv(mu);
  __tsan_mutex_post_lock(mu, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed),
                         0);
  return locked;
}
void __wrap__ZN4absl7debian35Mutex10ReaderLockEv(void* mu) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_read_lock);
  __real__ZN4absl7debian35Mutex10ReaderLockEv(mu);
  __tsan_mutex_post_lock(mu, __tsan_mutex_read_lock, 0);
}
void __wrap__ZN4absl7debian35Mutex12ReaderUnlockEv(void* mu) {
  __tsan_mutex_pre_unlock(mu, __tsan_mutex_read_lock);
  __real__ZN4absl7debian35Mutex12ReaderUnlockEv(mu);
  __tsan_mutex_post_unlock(mu, __tsan_mutex_read_lock);
}
bool __wrap__ZN4absl7debian35Mutex13ReaderTryLockEv(void* mu) {
  const unsigned flags = __tsan_mutex_read_lock | __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(mu, flags);
  const bool locked = __real__ZN4absl7debian35Mutex13ReaderTryLockEv(mu);
  __tsan_mutex_post_lock(mu, flags | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
}
void __wrap__ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE(void* mu,
                                                              const absl::Condition& cond) {
  Guarded g{mu, &cond};
  const absl::Condition guarded(&EvalGuarded, &g);
  __real__ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE(mu, guarded);
  Locked(mu);
}
bool __wrap__ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE(
    void* mu, const absl::Condition& cond, absl::Duration d) {
  Guarded g{mu, &cond};
  const absl::Condition guarded(&EvalGuarded, &g);
  const bool met =
      __real__ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE(
          mu, guarded, d);
  Locked(mu);
  return met;
}
bool __wrap__ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE(
    void* mu, const absl::Condition& cond, absl::Time t) {
  Guarded g{mu, &cond};
  const absl::Condition guarded(&EvalGuarded, &g);
  const bool met = __real__ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE(
      mu, guarded, t);
  Locked(mu);
  return met;
}
// The waits below let the mutex go while they wait and take it again before they return.
void __wrap__ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(void* mu, const absl::Condition& cond) {
  Guarded g{mu, &cond};
  const absl::Condition guarded(&EvalGuarded, &g);
  Unlocking(mu);
  __real__ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(mu, guarded);
  Locked(mu);
}
bool __wrap__ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(
    void* mu, const absl::Condition& cond, absl::Duration d) {
  Guarded g{mu, &cond};
  const absl::Condition guarded(&EvalGuarded, &g);
  Unlocking(mu);
  const bool met = __real__ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(
      mu, guarded, d);
  Locked(mu);
  return met;
}
bool __wrap__ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE(
    void* mu, const absl::Condition& cond, absl::Time t) {
  Guarded g{mu, &cond};
  const absl::Condition guarded(&EvalGuarded, &g);
  Unlocking(mu);
  const bool met =
      __real__ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE(mu, guarded, t);
  Locked(mu);
  return met;
}
void __wrap__ZN4absl7debian35MutexD1Ev(void* mu) {
  __real__ZN4absl7debian35MutexD1Ev(mu);
  __tsan_mutex_destroy(mu, 0);
}
void __wrap__ZN4absl7debian37CondVar4WaitEPNS0_5MutexE(void* cv, void* mu) {
  Unlocking(mu);
  __real__ZN4absl7debian37CondVar4WaitEPNS0_5MutexE(cv, mu);
  Locked(mu);
}
bool __wrap__ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(void* cv, void* mu,
                                                                                 absl::Duration d) {
  Unlocking(mu);
  const bool timed_out =
      __real__ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(cv, mu, d);
  Locked(mu);
  return timed_out;
}
bool __wrap__ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(void* cv, void* mu,
                                                                              absl::Time t) {
  Unlocking(mu);
  const bool timed_out =
      __real__ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(cv, mu, t);
  Locked(mu);
  return timed_out;
}
void __wrap__ZN4absl7debian312Notification6NotifyEv(void* n) {
  __tsan_release(n);
  __tsan_release(Flag(n));
  __real__ZN4absl7debian312Notification6NotifyEv(n);
}
void __wrap__ZNK4absl7debian312Notification19WaitForNotificationEv(const void* n) {
  __real__ZNK4absl7debian312Notification19WaitForNotificationEv(n);
  __tsan_acquire(const_cast<void*>(n));
}
bool __wrap__ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(
    const void* n, absl::Duration d) {
  const bool notified =
      __real__ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(n, d);
  if (notified) __tsan_acquire(const_cast<void*>(n));
  return notified;
}
bool __wrap__ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE(
    const void* n, absl::Time t) {
  const bool notified =
      __real__ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE(n, t);
  if (notified) __tsan_acquire(const_cast<void*>(n));
  return notified;
}

}  // extern "C"
