#include "actors/checkpoint_store.h"
