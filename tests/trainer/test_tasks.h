#ifndef TRAINYARD_TESTS_TRAINER_TEST_TASKS_H_
#define TRAINYARD_TESTS_TRAINER_TEST_TASKS_H_

// The task of one rank, as the agent hands it to a trainer, for the trainer's test programs (no
// LibTorch here: the binary tests include it too).

#include <string>

#include "trainyard/v1/agent_service.pb.h"

namespace trainyard::trainer::test_tasks {

// Rank 0 of the only rank of generation 1 of `job_id`, strategy single, checkpointing under
// `checkpoint_dir` (none when empty); the caller fills in the rest of the spec.
inline trainyard::v1::Task SingleRankTask(const std::string& job_id,
                                          const std::string& checkpoint_dir) {
  trainyard::v1::Task task;
  task.set_task_id(job_id + ".g1.r0");
  task.set_job_id(job_id);
  task.set_generation(1);
  task.set_world_size(1);
  task.set_slots(1);
  if (!checkpoint_dir.empty()) task.set_checkpoint_uri("file://" + checkpoint_dir);
  task.mutable_spec()->set_strategy(trainyard::v1::SINGLE);
  return task;
}

}  // namespace trainyard::trainer::test_tasks

#endif  // TRAINYARD_TESTS_TRAINER_TEST_TASKS_H_
